"""Replay: the simulator predicts each recorded step from the recorded state (PROTOCOL.md §3).

The cursor walks a session's recorded steps. At each one it places the screen where
the record says it was (feed offset and the cards in view; open item, page offset
and panel), shows that state, and then applies the recorded action leniently,
whatever was predicted: a recorded scroll is never refused for its distance, and
the visit's memory (what was already done on the item) builds up from the record.
Detail pages are laid out as rollout lays them out (``evaluation.environment``), so a
replayed screen is the screen rollout shows in the same state: on the main page only
the review preview's ``C1``, and only while the preview is in view. Where the record
says the page held more than its layout (the shopper opens a review the layout does
not show there, or scrolls down from the layout's bottom), the step is shown as the
record has it but not scored: its own action would be the only evidence of what was
on screen.

A recorded step whose state cannot be rebuilt is not scored; ``skipped`` counts
such steps by reason (``SKIP_REASONS``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from evaluation.environment import EnvironmentSettings, ShoppingEnvironment, cards_in_view, shown_px
from evaluation.session import RecordedStep, Session, Trajectory
from transforms.prompts import (
    Accepted,
    Observation,
    PromptSettings,
    State,
    Verdict,
    judge_response,
    render_state,
)
from transforms.schemas import FEED_ACTIONS, IPV_ACTIONS

SKIP_REASONS: tuple[str, ...] = (
    "missing_feed_offset",  # a feed step without its offset
    "visible_items_differ",  # the layout at the recorded offset shows other cards than were recorded
    "visible_item_not_in_catalog",
    "no_open_item",  # a detail-page step without its item
    "open_item_not_in_catalog",
    "action_off_screen",  # the recorded action is not one of its screen's actions
    "review_out_of_view",  # the main page as laid out does not show the review the shopper opened
    "scroll_past_page_end",  # the shopper scrolled down from the bottom of the page as laid out
)
#: why a recorded detail-page action that the layout says could not be taken is not scored
WIDENED_REASONS = {"ipv_click_comment": "review_out_of_view", "ipv_scroll_down": "scroll_past_page_end"}
SCREEN_ACTIONS = {"feed": FEED_ACTIONS, "ipv": IPV_ACTIONS}


@dataclass(frozen=True)
class ScoredStep:
    """One scored recorded step: the state shown and the action the shopper took."""

    recorded: RecordedStep
    state: State
    gold: Accepted
    settings: PromptSettings

    def messages(self) -> list[dict[str, str]]:
        return render_state(self.state, self.settings)

    def judge(self, text: str) -> Verdict:
        """The prediction checked against the recorded state."""
        return judge_response(text, self.state.observation, self.settings)


def recorded_action(step: RecordedStep, session: Session) -> Accepted:
    """The recorded action as an executable action (the click's title from the catalog where known)."""
    title = step.target_title
    if step.action == "click" and step.target_item_id in session.items:
        title = session.items[step.target_item_id].title or title
    return Accepted(
        step.action,
        target_item_id=step.target_item_id if step.action == "click" else None,
        target_title=title if step.action == "click" else None,
        review_alias=step.review_alias if step.action == "ipv_click_comment" else None,
        distance=step.distance,
    )


class ReplayCursor:
    """The scored steps of one session (iterate) and the count of those it could not rebuild."""

    def __init__(
        self,
        session: Session,
        settings: EnvironmentSettings | None = None,
        trajectory: Trajectory | None = None,
    ) -> None:
        self.session = session
        self.settings = settings or EnvironmentSettings()
        self.trajectory = trajectory or Trajectory()
        self.skipped: Counter[str] = Counter()
        self.skipped_steps: list[tuple[int, str]] = []  # (step, reason)
        self.steps: list[ScoredStep] = []
        self._walk()

    def __iter__(self) -> Iterator[ScoredStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def _walk(self) -> None:
        env = ShoppingEnvironment(self.session, self.settings)
        for recorded in self.session.steps:
            gold = recorded_action(recorded, self.session)
            observation, reason = self._seat(env, recorded, gold)
            on_screen = gold.type in SCREEN_ACTIONS.get(recorded.screen, ())
            reason = reason or (None if on_screen else "action_off_screen")
            if reason is not None:
                self.skipped[reason] += 1
                self.skipped_steps.append((recorded.step, reason))
            if observation is None:
                continue
            if reason is None:
                state = self.trajectory.state(self.session, observation)
                self.steps.append(ScoredStep(recorded, state, gold, self.settings.prompt))
            # an unscored step still enters the window, as far as the record shows it, with the lake's
            # rationale for it as the records' windows show one
            self.trajectory.record(recorded.step, observation, gold.action_object(), recorded.rationale)
            # a click the record names by title only opens nothing: the next step seats its page
            opens_nothing = gold.type == "click" and gold.target_item_id is None
            if on_screen and env.screen == recorded.screen and not env.ended and not opens_nothing:
                env.apply(gold)

    def _seat(
        self, env: ShoppingEnvironment, step: RecordedStep, gold: Accepted
    ) -> tuple[Observation | None, str | None]:
        """Place ``env`` at ``step``'s recorded state: what it shows (None: nothing), why it is not scored."""
        if step.screen == "feed":
            return self._seat_feed(env, step)
        if step.ipv_item_id is None:
            return None, "no_open_item"
        if step.scroll_top is not None:
            env.offset = step.scroll_top
        env.seat_page(step.ipv_item_id, step.ipv_scroll, step.ui_state)
        widened = env.widen_to(gold)
        if step.ipv_item_id not in self.session.items:
            return env.observation(), "open_item_not_in_catalog"
        return env.observation(), WIDENED_REASONS[gold.type] if widened else None

    def _seat_feed(self, env: ShoppingEnvironment, step: RecordedStep) -> tuple[Observation, str | None]:
        recorded = step.visible_items
        if step.scroll_top is None:
            # no offset to place the feed at: only a logged list of cards says what was in view
            cards = [self.session.item(i).card() for i in recorded or ()]
            shown = Observation(screen="feed", max_scroll=shown_px(env.max_offset), cards=cards)
            return shown, "missing_feed_offset" if recorded is None else self._catalog_check(recorded)
        if step.visible_source == "logged" and recorded is not None:
            env.seat_feed(step.scroll_top, recorded)
            return env.observation(), self._catalog_check(recorded)
        env.seat_feed(step.scroll_top)
        in_view = tuple(cards_in_view(self.session.cards, env.offset, self.settings.geometry))
        if recorded is not None and in_view != recorded:
            env.seat_feed(step.scroll_top, recorded)
            return env.observation(), "visible_items_differ"
        return env.observation(), self._catalog_check(in_view)

    def _catalog_check(self, visible: tuple[str, ...]) -> str | None:
        return "visible_item_not_in_catalog" if any(i not in self.session.items for i in visible) else None

"""Replay: the simulator predicts each recorded step from the recorded state (PROTOCOL.md §3).

The cursor walks a session's recorded steps. At each one it places the screen where
the record says it was (feed offset and the cards in view; open item, page offset
and panel), shows that state, and then applies the recorded action leniently,
whatever was predicted: a recorded scroll is never refused for its distance, and
the visit's memory (what was already done on the item) builds up from the record.

A recorded step whose state cannot be rebuilt is not scored; ``skipped`` counts
such steps by reason (``SKIP_REASONS``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from evaluation.environment import EnvironmentSettings, ShoppingEnvironment, cards_in_view
from evaluation.session import RecordedStep, Session
from transforms.prompts import (
    Accepted,
    Observation,
    PastStep,
    PromptSettings,
    State,
    Verdict,
    judge_response,
    past_step,
    render_state,
)
from transforms.prompts.render import Mode

SKIP_REASONS: tuple[str, ...] = (
    "missing_feed_offset",  # a feed step without its offset
    "visible_items_differ",  # the layout at the recorded offset shows other cards than were recorded
    "visible_item_not_in_catalog",
    "no_open_item",  # a detail-page step without its item
    "open_item_not_in_catalog",
)


@dataclass(frozen=True)
class ReplayStep:
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
        *,
        mode: Mode = "single",
        window: Sequence[PastStep] = (),
        session_ordinal: int | None = None,
        gap_s: float | None = None,
    ) -> None:
        self.session = session
        self.settings = settings or EnvironmentSettings()
        self.mode: Mode = mode
        self.window: list[PastStep] = list(window)
        self.skipped: Counter[str] = Counter()
        self.skipped_steps: list[tuple[int, str]] = []  # (step, reason)
        self.steps: list[ReplayStep] = []
        self._ordinal, self._gap_s = session_ordinal, gap_s
        self._walk()

    def __iter__(self) -> Iterator[ReplayStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def _walk(self) -> None:
        env = ShoppingEnvironment(self.session, self.settings)
        for number, recorded in enumerate(self.session.steps):
            placed, reason = self._seat(env, recorded)
            gold = recorded_action(recorded, self.session)
            if reason is not None:
                self.skipped[reason] += 1
                self.skipped_steps.append((recorded.step, reason))
            if not placed:
                continue
            observation = env.observation()
            if reason is None:
                state = self._state(observation)
                self.steps.append(ReplayStep(recorded, state, gold, self.settings.prompt))
            gap = self._gap_s if number == 0 and (self._ordinal or 1) > 1 else None
            entry = past_step(
                recorded.step, observation, gold.action_object(), session=self._ordinal, gap_s=gap
            )
            self.window.append(entry)
            if not env.ended:
                env.apply(gold)

    def _state(self, observation: Observation) -> State:
        s = self.session
        return State(
            mode=self.mode,
            profile=s.profile,
            profile_extra=s.profile_extra,
            recent_buys=list(s.recent_buys),
            recent_clicks=list(s.recent_clicks),
            window=list(self.window),
            observation=observation,
        )

    def _seat(self, env: ShoppingEnvironment, step: RecordedStep) -> tuple[bool, str | None]:
        """Place ``env`` at ``step``'s recorded state: (placed at all, why it is not scored)."""
        if step.screen == "feed":
            return self._seat_feed(env, step)
        if step.ipv_item_id is None:
            return False, "no_open_item"
        if step.scroll_top is not None:
            env.offset = step.scroll_top
        env.seat_page(step.ipv_item_id, step.ipv_scroll or 0.0, step.ui_state)
        return True, None if step.ipv_item_id in self.session.items else "open_item_not_in_catalog"

    def _seat_feed(self, env: ShoppingEnvironment, step: RecordedStep) -> tuple[bool, str | None]:
        if step.scroll_top is None:
            return False, "missing_feed_offset"
        recorded = step.visible_items
        if step.visible_source == "logged" and recorded is not None:
            env.seat_feed(step.scroll_top, recorded)
        else:
            env.seat_feed(step.scroll_top)
            shown = tuple(cards_in_view(self.session.cards, env.offset, self.settings.geometry))
            if recorded is not None and shown != recorded:
                env.seat_feed(step.scroll_top, recorded)
                return True, "visible_items_differ"
        if any(item not in self.session.items for item in env.visible_item_ids()):
            return True, "visible_item_not_in_catalog"
        return True, None

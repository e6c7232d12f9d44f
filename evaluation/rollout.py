"""A rollout episode: the simulator drives one session (PROTOCOL.md §3).

Every output is an ``Attempt`` kept with its verdict. Accepted actions are
executed and enter the history window; invalid outputs change nothing and do not
consume the action budget, but ``max_try`` consecutive ones end the episode.
Endings: ``end`` (terminated), or truncated by ``budget`` (the budget spent
without ``end``), ``invalid_retry_exhausted`` or ``error`` (the simulator failed).
"""

from __future__ import annotations

from dataclasses import dataclass

from evaluation.environment import EnvironmentSettings, ShoppingEnvironment
from evaluation.session import Session, Trajectory
from transforms.prompts import Accepted, Observation, PastStep, State, Verdict, judge_response, render_state

TERMINATED = "end"
TRUNCATION_REASONS: tuple[str, ...] = ("budget", "invalid_retry_exhausted", "error")


@dataclass(frozen=True)
class Attempt:
    """One simulator output and what became of it."""

    index: int  # 1-based over all outputs of the episode
    step: int | None  # 0-based accepted step it became, None when rejected
    screen: str
    raw_output: str
    accepted: bool
    reject_reason: str | None
    detail: str | None
    action: str | None  # the type asked for (None when the response did not parse)
    target_item_id: str | None  # the clicked card, or the open item on the detail page
    review_alias: str | None
    distance: int | None
    rationale: str | None
    item_category: str | None
    item_price: float | None
    visible_item_ids: tuple[str, ...]


class Rollout:
    """One session driven by a simulator: ``messages()`` to show, ``submit(text)`` its answer."""

    def __init__(
        self,
        session: Session,
        settings: EnvironmentSettings | None = None,
        trajectory: Trajectory | None = None,
    ) -> None:
        self.settings = settings or EnvironmentSettings()
        self.env = ShoppingEnvironment(session, self.settings)
        self.trajectory = trajectory or Trajectory()
        self.budget = self.settings.budget(self.trajectory.mode)
        self.attempts: list[Attempt] = []
        self.accepted_steps = 0
        self.invalid_in_a_row = 0
        self.termination_reason: str | None = None
        self.error: str | None = None  # what the simulator failed with

    @property
    def session(self) -> Session:
        return self.env.session

    @property
    def done(self) -> bool:
        return self.termination_reason is not None

    @property
    def terminated(self) -> bool:
        return self.termination_reason == TERMINATED

    @property
    def truncated(self) -> bool:
        return self.termination_reason in TRUNCATION_REASONS

    @property
    def window(self) -> list[PastStep]:
        return self.trajectory.window

    def state(self) -> State:
        return self.trajectory.state(self.session, self.env.observation())

    def messages(self) -> list[dict[str, str]]:
        """The chat messages of the current state, rendered as the training prompts are."""
        return render_state(self.state(), self.settings.prompt)

    def submit(self, text: str) -> Attempt:
        """Judge and, when accepted, execute one simulator output."""
        if self.done:
            raise RuntimeError(f"the episode is over ({self.termination_reason})")
        before = self.env.observation()
        verdict = judge_response(text, before, self.settings.prompt)
        step = self.accepted_steps if isinstance(verdict, Accepted) else None
        attempt = self._attempt(text, before, verdict, step)
        self.attempts.append(attempt)
        if isinstance(verdict, Accepted):
            self._execute(verdict, before)
        else:
            self.invalid_in_a_row += 1
            if self.invalid_in_a_row >= self.settings.max_try:
                self.termination_reason = "invalid_retry_exhausted"
        return attempt

    def fail(self, error: str) -> None:
        """The simulator could not answer (timeout, server error): the episode ends truncated."""
        if not self.done:
            self.termination_reason = "error"
            self.error = error

    def _execute(self, action: Accepted, before: Observation) -> None:
        rationale = action.rationale or None
        self.trajectory.record(self.accepted_steps, before, action.action_object(), rationale)
        self.env.apply(action)
        self.accepted_steps += 1
        self.invalid_in_a_row = 0
        if self.env.ended:
            self.termination_reason = TERMINATED
        elif self.accepted_steps >= self.budget:
            self.termination_reason = "budget"

    def _attempt(self, text: str, before: Observation, verdict: Verdict, step: int | None) -> Attempt:
        item_id = self._item_of(before, verdict)
        item = self.session.items.get(item_id) if item_id is not None else None
        if isinstance(verdict, Accepted):
            outcome = {"reject_reason": None, "detail": None, "review_alias": verdict.review_alias}
            outcome |= {"distance": verdict.distance, "rationale": verdict.rationale}
        else:
            outcome = {"reject_reason": verdict.reason, "detail": verdict.detail, "review_alias": None}
            outcome |= {"distance": None, "rationale": None}
        return Attempt(
            index=len(self.attempts) + 1,
            step=step,
            screen=before.screen,
            raw_output=text,
            accepted=isinstance(verdict, Accepted),
            action=verdict.type,
            target_item_id=item_id,
            item_category=item.category if item else None,
            item_price=item.price if item else None,
            visible_item_ids=tuple(c.item_id for c in before.cards),
            **outcome,
        )

    @staticmethod
    def _item_of(before: Observation, verdict: Verdict) -> str | None:
        """The item a step carries: the clicked card, or the open detail page's item."""
        if before.screen == "ipv":
            return before.page.item_id if before.page else None
        return verdict.target_item_id if isinstance(verdict, Accepted) else None

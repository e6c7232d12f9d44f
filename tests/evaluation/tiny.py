"""Tiny traces written by hand for the metric tests: compact step specs, frames through the real reader,
and the same traces in the reference implementation's fields (PROTOCOL.md §5)."""

from __future__ import annotations

import json
from pathlib import Path

from evaluation.traces import (
    ReplayStep,
    Trace,
    TraceFrames,
    TraceProfile,
    TraceStep,
    load_traces,
    write_jsonl,
)
from transforms.schemas import IPV_ACTIONS

IPV_ONLY = set(IPV_ACTIONS) - {"end"}


def steps(
    *specs: str, item: str = "i1", category: str | None = "A-x-y", price: float | None = 10.0
) -> list[TraceStep]:
    """``"click"``, ``"ipv_cart"``, ``"end@ipv"`` (end on the detail page), ``"!ipv_buy"`` (rejected).

    The screen follows the action (end is on the feed unless marked); clicks and detail-page steps carry
    ``item`` with its category and price.
    """
    out = []
    for spec in specs:
        rejected = spec.startswith("!")
        action, _, screen = spec.lstrip("!").partition("@")
        screen = screen or ("ipv" if action in IPV_ONLY else "feed")
        carries = action == "click" or screen == "ipv"
        out.append(
            TraceStep(
                screen=screen,
                action=action,
                target_item_id=item if carries else None,
                accepted=not rejected,
                reject_reason="illegal_in_state" if rejected else None,
                item_category=category if carries else None,
                item_price=price if carries else None,
            )
        )
    return out


def trace(
    session_id: str,
    step_list: list[TraceStep],
    *,
    user_id: str | None = None,
    truncated: bool = False,
    prior_clicks: int = 0,
    prior_buys: int = 0,
    categories: list[str] | None = None,
    source: str = "real",
) -> Trace:
    return Trace(
        session_id=session_id,
        user_id=user_id or f"u-{session_id}",
        source=source,
        terminated=not truncated,
        truncated=truncated,
        termination_reason="budget" if truncated else "end",
        profile=TraceProfile(
            prior_clicks=prior_clicks, prior_buys=prior_buys, recent_click_categories=categories or []
        ),
        steps=step_list,
    )


def frames(tmp_path: Path, name: str, traces: list[Trace]) -> TraceFrames:
    """Write ``traces`` as our JSONL and read them back as frames, as ``trajforge score`` does."""
    path = tmp_path / f"{name}.jsonl"
    write_jsonl(path, traces)
    return load_traces(path)


LAYER = {"feed": "feed", "ipv": "ipv"}


def population() -> list:
    """A few real-looking sessions: visits with every decision, rejected outputs, a truncated session."""
    out = []
    for number in range(12):
        walk = steps(
            "scroll_down",
            "click",
            "ipv_swipe_pic",
            *(["!ipv_buy"] if number % 3 == 0 else []),
            ("ipv_cart" if number % 2 else "ipv_click_param"),
            "back_home",
            *(["click", "ipv_buy", "end@ipv"] if number % 4 == 0 else ["end"]),
            item=f"i{number}",
            category=["A-x-y", "B-z-w", "C-q-r"][number % 3],
            price=10.0 + number,
        )
        if number == 5:
            walk = walk[:-1]  # budget ran out before the end
        out.append(
            trace(
                f"s{number}",
                walk,
                user_id=f"u{number % 7}",
                truncated=number == 5,
                prior_clicks=number * 3,
                prior_buys=number % 4,
                categories=["A-x-y", "C-q-r"][: number % 3],
                source="real" if number % 2 else "sim",
            )
        )
    return out


def as_reference(record) -> dict:
    """Our trace in the reference's episode fields (PROTOCOL.md §5), written from the spec."""
    reference_steps = []
    for index, step in enumerate(record.steps, start=1):
        reference_steps.append(
            {
                "index": index,
                "layer": LAYER[step.screen],
                "screen_type": step.screen,
                "action": step.action,
                "executed": step.accepted,
                "parse_ok": True,
                "legal": step.accepted,  # our rejections here are all illegal_in_state
                "target_resolved": True,
                "reject_reason": "",  # left empty: the reader derives it from the failed check
                "target_item_id": step.target_item_id,
                "target_title": None,
                "target_alias": step.review_alias,
                "item_price": None if step.item_price is None else f"¥{step.item_price}",
                "item_cate": step.item_category or "",
                "raw_output": step.raw_output or "",
            }
        )
    number = int(record.session_id[1:])
    return {
        "kind": "rollout",
        "session_id": record.session_id,
        "source": record.source,
        # one of every two episodes names its visitor only inside the profile
        "visitor_id": record.user_id if number % 2 else "",
        "profile": {
            "visitor_id": record.user_id,
            "click_history": record.profile.prior_clicks,
            "buy_history": record.profile.prior_buys,
            "history_categories": record.profile.recent_click_categories,
            "attributes": {"age_band": "25-34"},
        },
        "steps": reference_steps,
        "terminated": record.terminated,
        "truncated": record.truncated,
        "termination_reason": record.termination_reason,
        "max_steps": 31,
        "model": "test",
        "error": "",
    }


def write_reference(path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def our_replay() -> list[ReplayStep]:
    def step(index, gt, pred, accepted=True, reason=None, **targets):
        screen = "ipv" if gt.startswith("ipv") else "feed"
        return ReplayStep(session_id="s", step_index=index, screen=screen, gt_action=gt, pred_action=pred,
                          accepted=accepted, reject_reason=reason, **targets)  # fmt: skip

    return [
        step(0, "click", "click", gt_target_item_id="a", pred_target_item_id="a", gt_target_title="Mug"),
        step(1, "ipv_click_comment", "ipv_click_comment", gt_review_alias="C1", pred_review_alias="C1"),
        step(2, "ipv_cart", "ipv_buy"),
        step(3, "scroll_down", "click", accepted=False, reason="target_unresolved"),
        step(4, "ipv_buy", None, accepted=False, reason="parse_failure", raw_output="not json"),
    ]


def as_reference_replay(record: ReplayStep) -> dict:
    return {
        "session_id": record.session_id,
        "step_index": record.step_index,
        "layer": record.screen,
        "gt_action": record.gt_action,
        "pred_action": record.pred_action,
        "gt_target_item_id": record.gt_target_item_id,
        "pred_target_item_id": record.pred_target_item_id,
        "gt_target_title": record.gt_target_title,
        "pred_target_title": record.pred_target_title,
        "gt_target_alias": record.gt_review_alias,
        "pred_target_alias": record.pred_review_alias,
        "parse_ok": record.reject_reason != "parse_failure",
        "legal": True,
        "target_resolved": record.reject_reason != "target_unresolved",
        "reject_reason": "",
        "prediction_present": True,
        "raw_output": record.raw_output or "",
        "model": "test",
    }

"""Tiny traces written by hand for the metric tests: compact step specs, frames through the real reader."""

from __future__ import annotations

from pathlib import Path

from evaluation.traces import Trace, TraceFrames, TraceProfile, TraceStep, load_traces, write_jsonl

IPV_ONLY = {
    "ipv_scroll_down",
    "ipv_scroll_up",
    "ipv_swipe_pic",
    "ipv_click_param",
    "ipv_enter_comment",
    "ipv_click_comment",
    "ipv_cart",
    "ipv_buy",
    "back_home",
}


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

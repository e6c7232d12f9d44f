"""Calibration statistics of a raw log bundle against UserArena's published figures.

``TARGETS`` are DATA.md's numbers as corrected by ERRATA.md; ``bundle_stats``
computes the same quantities from raw tables. Run ``python -m synthetic.calibration
--users 11010`` to print both side by side (with timings).
"""

from __future__ import annotations

import argparse
import time

import polars as pl

TARGETS: dict[str, float] = {
    "share_scroll_down": 0.3834,
    "share_click": 0.1276,
    "share_end": 0.1121,
    "share_back_home": 0.1062,
    "share_ipv_scroll_down": 0.1008,
    "share_ipv_cart": 0.0390,
    "share_ipv_buy": 0.0102,
    "share_other": 0.1197,  # scroll_up, ipv_scroll_up, swipe, param, enter/click comment
    "session_len_mean": 577_670 / 64_729,  # 8.92
    "session_len_median": 8,
    "single_len_median": 14,
    "single_len_mean": 15,
    "cross_len_median": 8,
    "cross_len_mean": 8.4,
    "users_multi_share": 5_768 / 11_010,  # 0.524
    "sessions_per_user": 64_729 / 11_010,  # 5.88
    "cross_sessions_per_user": 59_378 / 5_768,  # 10.29
    "clicks_per_session": 73_717 / 64_729,  # 1.139
    "category_continuation": 0.578,
    "gap_under_5min": 0.346,
    "gap_over_12h": 0.133,
    "apparel_click_share": 0.5490,
    "jewellery_click_share": 0.0577,
    "bags_click_share": 0.0483,
    "items_clicked_once": 0.920,
    "top1pct_item_click_share": 0.0323,
}
MAIN_ACTIONS = ("scroll_down", "click", "end", "back_home", "ipv_scroll_down", "ipv_cart", "ipv_buy")


def _top_l1(category: pl.Expr) -> pl.Expr:
    return category.str.split("-").list.first()


def session_frame(events: pl.DataFrame, items: pl.DataFrame) -> pl.DataFrame:
    """One row per page view: user, start/end, length, clicks, the session's top clicked category."""
    clicks = (
        events.filter(pl.col("action") == "click")
        .join(items.select("item_id", _top_l1(pl.col("category")).alias("l1")), on="item_id", how="left")
        .group_by("page_view_id", "l1")
        .agg(pl.len().alias("n"), pl.col("ts").min().alias("first_ts"))
        .sort("page_view_id", "n", "first_ts", descending=[False, True, False])
        .group_by("page_view_id", maintain_order=True)
        .agg(pl.col("l1").first().alias("top_l1"))
    )
    return (
        events.group_by("page_view_id")
        .agg(
            pl.col("user_id").first(),
            pl.col("ts").min().alias("start"),
            pl.col("ts").max().alias("stop"),
            pl.len().alias("length"),
            (pl.col("action") == "click").sum().alias("clicks"),
        )
        .join(clicks, on="page_view_id", how="left")
        .sort("user_id", "start")
    )


def bundle_stats(events: pl.DataFrame, items: pl.DataFrame) -> dict[str, float]:
    """The ``TARGETS`` quantities (and a few more) measured on raw ``events`` and ``items``."""
    n = events.height
    share = dict(events.group_by("action").agg(pl.len() / n).iter_rows())
    stats = {f"share_{a}": share.get(a, 0.0) for a in MAIN_ACTIONS}
    stats["share_other"] = 1.0 - sum(stats.values())
    sessions = session_frame(events, items).with_columns(pl.len().over("user_id").alias("user_sessions"))
    single = sessions.filter(pl.col("user_sessions") == 1)["length"]
    cross = sessions.filter(pl.col("user_sessions") > 1)["length"]
    per_user = sessions.group_by("user_id").agg(pl.len().alias("k"))["k"]
    pairs = sessions.with_columns(
        pl.col("top_l1").shift().over("user_id").alias("prev_l1"),
        ((pl.col("start") - pl.col("stop").shift().over("user_id")).dt.total_seconds()).alias("gap_s"),
    ).filter(pl.col("gap_s").is_not_null())
    with_cats = pairs.filter(pl.col("top_l1").is_not_null() & pl.col("prev_l1").is_not_null())
    click_items = events.filter(pl.col("action") == "click").join(
        items.select("item_id", _top_l1(pl.col("category")).alias("l1")), on="item_id", how="left"
    )
    per_item = click_items.group_by("item_id").agg(pl.len().alias("c"))["c"].sort(descending=True)
    top = max(1, round(len(per_item) * 0.01))
    l1_share = dict(click_items.group_by("l1").agg(pl.len() / click_items.height).iter_rows())
    stats |= {
        "session_len_mean": sessions["length"].mean(),
        "session_len_median": sessions["length"].median(),
        "single_len_median": single.median(),
        "single_len_mean": single.mean(),
        "cross_len_median": cross.median(),
        "cross_len_mean": cross.mean(),
        "users_multi_share": (per_user > 1).mean(),
        "sessions_per_user": per_user.mean(),
        "cross_sessions_per_user": per_user.filter(per_user > 1).mean(),
        "clicks_per_session": sessions["clicks"].mean(),
        "category_continuation": (with_cats["top_l1"] == with_cats["prev_l1"]).mean(),
        "gap_under_5min": (pairs["gap_s"] < 300).mean(),
        "gap_over_12h": (pairs["gap_s"] > 43_200).mean(),
        "apparel_click_share": l1_share.get("Apparel", 0.0),
        "jewellery_click_share": l1_share.get("Jewellery", 0.0),
        "bags_click_share": l1_share.get("Bags", 0.0),
        "items_clicked_once": (per_item == 1).mean(),
        "top1pct_item_click_share": per_item.head(top).sum() / per_item.sum(),
        # extras (no published target)
        "sessions_ending_on_ipv": ((events["action"] == "end") & (events["screen"] == "ipv")).sum()
        / sessions.height,
        "sessions_with_click": (sessions["clicks"] > 0).mean(),
        "max_single_len": single.max(),
        "max_len": sessions["length"].max(),
    }
    return stats


def pv_ctr(events: pl.DataFrame) -> float:
    """Clicks per feed page view (the A/B metric of PROTOCOL.md)."""
    return (events["action"] == "click").sum() / events["page_view_id"].n_unique()


def pv_ctr_by_arm(events: pl.DataFrame, profiles: pl.DataFrame) -> dict[str, float]:
    arms = events.join(profiles.select("user_id", "ab_arm"), on="user_id", how="left")
    return {arm: pv_ctr(part) for (arm,), part in arms.partition_by("ab_arm", as_dict=True).items()}


def report(stats: dict[str, float]) -> str:
    lines = [f"{'statistic':28s} {'measured':>10s} {'target':>10s}"]
    for name, value in stats.items():
        target = TARGETS.get(name)
        lines.append(f"{name:28s} {value:10.4f} {'' if target is None else f'{target:10.4f}'}")
    return "\n".join(lines)


def main() -> None:
    from synthetic.world import World

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=11_010)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    t0 = time.perf_counter()
    world = World.build(args.users, args.seed)
    bundle = world.simulate(policy="ab", seed=args.seed)
    t1 = time.perf_counter()
    print(f"simulated {bundle.events.height} events, {bundle.sessions.height} sessions in {t1 - t0:.1f}s")
    print(report(bundle_stats(bundle.events, bundle.items)))
    print("PV-CTR by arm:", pv_ctr_by_arm(bundle.events, bundle.profiles))
    print("ground truth (all shoppers under each policy):", world.ab_effect(seed=args.seed))


if __name__ == "__main__":
    main()

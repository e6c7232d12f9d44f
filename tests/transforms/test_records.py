"""Records: the pure renderer (golden text), the vectorised builder (same text), windows, export."""

from __future__ import annotations

import json
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from transforms.lake import read_lake_table, table_files, write_quarantine, write_table
from transforms.prompts import (
    Card,
    DetailPage,
    Observation,
    Param,
    PastStep,
    PromptSettings,
    State,
    gold_action,
    legal_actions,
    past_step,
    render_prompt,
    render_state,
    response_json,
    system_prompt,
    token_estimate,
)
from transforms.prompts.render import DONE_ACTIONS, fmt_gap, fmt_price
from transforms.records import NothingToTrainOn, build_records, export_chat_jsonl, item_texts, write_records
from transforms.schemas import HISTORY, ITEMS, PROFILE_FIELDS, QUARANTINE, RATIONALES, SESSIONS, STEPS

GOLDEN = Path(__file__).parent / "golden"
T0 = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)


def typed(rows: list[dict], schema) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=pl.Schema(pl.from_arrow(schema.empty_table()).schema))


# --- the golden prompts (hand-built states; the text was read by eye once) -------------


def golden_feed_state() -> State:
    return State(
        mode="single",
        profile={"age_band": "25-34", "gender": "female", "city_tier": "2", "purchase_power": None},
        profile_extra='{"vip":"yes"}',
        recent_buys=["Old Mug"],
        recent_clicks=["Old Mug", "Old Lamp\nwith shade"],
        window=[
            PastStep(
                step=0,
                summary="feed at 0 px, 2 items in view",
                action={"type": "scroll_down", "distance": 600},
                rationale="Nothing here catches my eye yet.",
            ),
        ],
        observation=Observation(
            screen="feed",
            scroll_top=600,
            max_scroll=1307,
            cards=[
                Card(item_id="i_b", title="Silver Ring", price=59.9, category_l1="Jewellery"),
                Card(item_id="i_c", title='Canvas "Tote"', price=35.5, category_l1="Bags"),
            ],
        ),
    )


def golden_ipv_state() -> State:
    return State(
        mode="cross",
        profile={name: None for name in PROFILE_FIELDS},
        window=[
            PastStep(step=6, session=1, summary="feed at 600 px, 2 items in view", action={"type": "end"}),
            PastStep(
                step=0,
                session=2,
                gap_s=4 * 3600 + 59,
                summary="feed at 0 px, 2 items in view",
                action={"type": "click", "target": "Linen Shirt", "target_item_id": "i_a"},
            ),
        ],
        observation=Observation(
            screen="ipv",
            scroll_top=0,
            max_scroll=1307,
            page=DetailPage(
                item_id="i_a",
                title="Linen Shirt",
                price=129.0,
                category="Apparel-Tops-Shirts",
                params=[Param(label="Material", value="linen")],
                reviews=["Great fabric", "Runs small\nsize up"],
                scroll=0,
                ui_state="comments",
                done={"ipv_enter_comment": 1},
            ),
        ),
    )


def chat_text(messages: list[dict[str, str]]) -> str:
    return "\n".join(f"<<{m['role']}>>\n{m['content']}" for m in messages) + "\n"


@pytest.mark.parametrize(
    ("name", "state"),
    [("prompt_feed_single.txt", golden_feed_state), ("prompt_ipv_cross.txt", golden_ipv_state)],
)
def test_rendered_prompt_matches_golden(name, state):
    assert chat_text(render_state(state())) == (GOLDEN / name).read_text(encoding="utf-8")


# --- small pure pieces --------------------------------------------------------------------


def test_price_rounds_half_up_with_two_decimals():
    # 59.9 -> "59.90"; 0.125*100 + 0.5 = 13.0 -> "0.13"; None -> "n/a"
    assert [fmt_price(59.9), fmt_price(0.125), fmt_price(None)] == ["59.90", "0.13", "n/a"]


def test_gap_labels():
    # 59 s -> under a minute; 299 s -> 4 min; 4 h 59 s -> 4 h; 3 days -> 3 days
    assert [fmt_gap(59), fmt_gap(299), fmt_gap(4 * 3600 + 59), fmt_gap(3 * 86400)] == [
        "under a minute",
        "4 min",
        "4 h",
        "3 days",
    ]


def test_legal_actions_follow_the_protocol():
    top = Observation(screen="feed", scroll_top=0, max_scroll=1307, cards=[Card(item_id="i_a")])
    bottom = Observation(screen="feed", scroll_top=1307, max_scroll=1307)
    # offset 0: no scroll_up; a card in view: click allowed
    assert legal_actions(top) == ["scroll_down", "click", "end"]
    # at max offset with nothing in view: only scroll_up and end
    assert legal_actions(bottom) == ["scroll_up", "end"]
    bare = DetailPage(reviews=[], scroll=0, ui_state="main")
    listed = legal_actions(Observation(screen="ipv", page=bare))
    # page offset 0: no ipv_scroll_up; no reviews: no ipv_click_comment
    assert "ipv_scroll_up" not in listed and "ipv_click_comment" not in listed
    page = DetailPage(reviews=["ok"], scroll=10, ui_state="main")
    # the page's review block shows C1 (inline_reviews = 2): a review is in view
    assert {"ipv_scroll_up", "ipv_click_comment"} <= set(legal_actions(Observation(screen="ipv", page=page)))
    # no review block on the page: only the opened list puts reviews in view
    no_block = PromptSettings(inline_reviews=0)
    assert "ipv_click_comment" not in legal_actions(Observation(screen="ipv", page=page), no_block)
    opened = Observation(screen="ipv", page=page.model_copy(update={"ui_state": "comments"}))
    assert "ipv_click_comment" in legal_actions(opened, no_block)


def test_gold_action_shapes_and_response():
    assert gold_action("click", target_title="A\nB", target_item_id="i_a") == {
        "type": "click",
        "target": "A B",
        "target_item_id": "i_a",
    }
    assert gold_action("ipv_click_comment", review_alias="C2") == {
        "type": "ipv_click_comment",
        "target": "C2",
    }
    assert gold_action("scroll_up", distance=400) == {"type": "scroll_up", "distance": 400}
    assert gold_action("ipv_cart", distance=5) == {"type": "ipv_cart"}
    # compact JSON, empty rationale until extraction fills it
    assert response_json(None, {"type": "end"}) == '{"rationale":"","action":{"type":"end"}}'


def test_token_estimate_is_ceil_bytes_over_three():
    # "abcd" = 4 bytes -> ceil(4/3) = 2; "中" = 3 bytes -> 1
    assert token_estimate("abcd") == 2 and token_estimate("中") == 1


def test_window_keeps_last_n_steps():
    past = [
        PastStep(step=i, summary="feed at 0 px, 0 items in view", action={"type": "end"}) for i in range(12)
    ]
    state = State(window=past, observation=Observation(screen="feed", scroll_top=0))
    prompt = render_prompt(state, PromptSettings(window_single=3))
    # only steps 9, 10, 11 remain, oldest first
    assert "step 8:" not in prompt and prompt.index("step 9:") < prompt.index("step 11:")


# --- a random world: the vectorised builder must give the renderer's text ------------------

TITLES = ['Tee "Classic"', "连衣裙 夏季\n新款", "Back\\slash bag", "Tab\there", "Plain mug", "Wool scarf"]
UI = ["main", "comments", "params", None, "Reviews-List", ""]


def random_world(seed: int = 7, users: int = 12) -> dict[str, pl.DataFrame]:
    rng = random.Random(seed)
    items = []
    for i in range(10):
        title = None if i == 9 else f"{rng.choice(TITLES)} {i}"
        reviews = [f"review {k}\nline" * rng.randint(1, 40) for k in range(rng.randint(0, 4))]
        params = [{"label": "Size", "value": rng.choice(["M", None])}] if i % 3 else []
        items.append(
            dict(
                item_id=f"i_{i}",
                title=title,
                price=None if i == 8 else round(rng.uniform(1, 300), 2),
                category="Apparel-Tops-Tees" if i % 2 else "Bags-Totes-Canvas",
                category_l1="Apparel" if i % 2 else "Bags",
                params=params,
                reviews=reviews,
            )
        )
    steps, sessions, history = [], [], []
    for u in range(users):
        user, split = f"u_{u:02d}", rng.choice(["train", "val", "test"])
        profile = {name: rng.choice(["x", None, "y\nz"]) for name in PROFILE_FIELDS}
        extra = rng.choice([None, "{}", '{"vip":"1"}'])
        start = T0 + timedelta(hours=rng.randint(0, 5))
        for _ in range(rng.randint(0, 25)):
            kind = rng.choice(["click", "buy"])
            ts = T0 - timedelta(hours=rng.randint(1, 30))  # repeated hours: ties in ts
            history.append(
                dict(user_id=user, ts=ts, kind=kind, title=rng.choice([*TITLES, None]), category="c")
            )
        for k in range(rng.choice([1, 1, 2, 3, 4])):
            sid = f"s_{u:02d}_{k}"
            feed_height = rng.choice([None, 2000, 500])
            ts, screen, open_item, top = start, "feed", None, rng.choice([0, 100])
            n = rng.randint(1, 30)
            for i in range(n):
                ts = ts + timedelta(seconds=rng.randint(1, 90))
                row = dict(session_id=sid, user_id=user, step=i, ts=ts, screen=screen, profile=profile)
                row.update(profile_extra=extra, split=split, bucket=u % 2, scroll_top=top)
                last = i == n - 1
                if screen == "feed":
                    visible = rng.sample([f"i_{j}" for j in range(10)] + ["i_missing"], rng.randint(0, 4))
                    row["visible_items"] = visible
                    options = ["scroll_down", "scroll_up"] + (["click"] * 2 if visible else [])
                    action = "end" if last else rng.choice(options)
                    if action == "click":
                        target = rng.choice(visible)
                        row.update(target_item_id=target, target_title=rng.choice([None, "stale title"]))
                        screen, open_item = "ipv", target
                    elif action.startswith("scroll"):
                        row["distance"] = rng.randint(1, 700)
                        top = max(0, top + (row["distance"] if action == "scroll_down" else -row["distance"]))
                else:
                    row.update(ipv_item_id=open_item, ipv_item_title="ipv title", ui_state=rng.choice(UI))
                    row["ipv_scroll"] = rng.choice([0, 0, 837])
                    action = "end" if last else rng.choice([*DONE_ACTIONS, "back_home", "back_home"])
                    if action == "ipv_click_comment":
                        row["review_alias"] = f"C{rng.randint(1, 3)}"
                    if action.startswith("ipv_scroll"):
                        row["distance"] = rng.randint(1, 837)
                    if action == "back_home":
                        screen = "feed"
                row["action"] = action
                steps.append(row)
            cats = rng.choice([[], ["Bags"], ["Apparel", "Bags"]])
            sessions.append(
                dict(session_id=sid, user_id=user, start_ts=start, end_ts=ts, length=n, categories=cats)
                | dict(feed_height=feed_height, split=split, bucket=u % 2, clicks=0, carts=0, buys=0)
            )
            start = ts + timedelta(minutes=rng.choice([0, 3, 90, 3000]))
    return {
        "items": typed(items, ITEMS),
        "steps": typed(steps, STEPS),
        "sessions": typed(sessions, SESSIONS),
        "history": typed(history, HISTORY),
    }


def reference_records(
    world: dict[str, pl.DataFrame], mode: str, settings: PromptSettings, rationales: dict[str, str]
) -> dict[str, tuple]:
    """Independent, loop-based construction of every state; returns record_id -> (prompt, response).

    ``rationales`` by record id; a state without one (or with a blank one) has no gold response."""
    items = {r["item_id"]: r for r in world["items"].to_dicts()}
    steps = world["steps"].sort("session_id", "step").to_dicts()
    sessions = sorted(
        world["sessions"].to_dicts(), key=lambda r: (r["user_id"], r["start_ts"], r["session_id"])
    )
    history = world["history"].to_dicts()
    by_user: dict[str, list[dict]] = {}
    for s in sessions:
        by_user.setdefault(s["user_id"], []).append(s)
    out = {}
    for user, chain in by_user.items():
        if mode == "cross" and len(chain) < 2:
            continue
        user_steps = [st for st in steps if st["user_id"] == user]
        window: list[PastStep] = []
        for ordinal, sess in enumerate(chain, start=1):
            if mode == "single":
                window = []
            events = [h for h in history if h["user_id"] == user and h["ts"] < sess["start_ts"]]
            if mode == "cross":
                for st in user_steps:
                    if st["action"] in ("click", "ipv_buy") and st["ts"] < sess["start_ts"]:
                        title = item_title(
                            items, st["target_item_id"] if st["action"] == "click" else st["ipv_item_id"]
                        )
                        fallback = st["target_title"] if st["action"] == "click" else st["ipv_item_title"]
                        kind = "click" if st["action"] == "click" else "buy"
                        events.append(
                            dict(ts=st["ts"], kind=kind, title=title if title is not None else fallback)
                        )
            events.sort(key=lambda e: (e["ts"], e["title"] or ""))
            recent = {k: [e["title"] for e in reversed(events) if e["kind"] == k] for k in ("click", "buy")}
            done: Counter = Counter()
            prev = chain[ordinal - 2] if ordinal > 1 else None
            for st in [x for x in user_steps if x["session_id"] == sess["session_id"]]:
                obs = observation(st, sess, items, dict(done), settings)
                state = State(
                    mode=mode,
                    profile=st["profile"],
                    profile_extra=st["profile_extra"],
                    recent_buys=recent["buy"],
                    recent_clicks=recent["click"],
                    window=window,
                    observation=obs,
                )
                target = item_title(items, st["target_item_id"])
                action = gold_action(
                    st["action"],
                    target_title=target if target is not None else st["target_title"],
                    target_item_id=st["target_item_id"],
                    review_alias=st["review_alias"],
                    distance=st["distance"],
                )
                record_id = f"{st['session_id']}:{st['step']}"
                thought = rationales.get(record_id, "").strip() and rationales[record_id]
                out[record_id] = (
                    render_prompt(state, settings),
                    response_json(thought, action, settings) if thought else None,
                )
                gap = None
                if st["step"] == 0 and prev is not None:
                    gap = max((sess["start_ts"] - prev["end_ts"]) // timedelta(milliseconds=1), 0) / 1000
                window = [
                    *window,
                    past_step(st["step"], obs, action, rationale=thought or None, session=ordinal, gap_s=gap),
                ]
                if st["action"] in DONE_ACTIONS:
                    done[st["action"]] += 1
                if st["action"] == "click":
                    done = Counter()
    return out


def item_title(items: dict, item_id: str | None) -> str | None:
    return items.get(item_id, {}).get("title") if item_id else None


def observation(st: dict, sess: dict, items: dict, done: dict, settings: PromptSettings) -> Observation:
    height = sess["feed_height"]
    max_scroll = None if height is None else max(height - settings.geometry.feed_viewport, 0)
    if st["screen"] == "feed":
        cards = []
        for item_id in st["visible_items"] or []:
            it = items.get(item_id, {})
            cards.append(
                Card(
                    item_id=item_id,
                    title=it.get("title"),
                    price=it.get("price"),
                    category_l1=it.get("category_l1"),
                )
            )
        return Observation(screen="feed", scroll_top=st["scroll_top"], max_scroll=max_scroll, cards=cards)
    it = items.get(st["ipv_item_id"], {})
    page = DetailPage(
        item_id=st["ipv_item_id"],
        title=it.get("title") if it.get("title") is not None else st["ipv_item_title"],
        price=it.get("price"),
        category=it.get("category"),
        params=[Param(**p) for p in it.get("params") or []],
        reviews=it.get("reviews") or [],
        scroll=st["ipv_scroll"],
        ui_state=st["ui_state"],
        done=done,
    )
    return Observation(screen="ipv", scroll_top=st["scroll_top"], max_scroll=max_scroll, page=page)


#: the click's line listing the ids in view, the action first, a click by its id alone
FOR_A_SMALL_MODEL = {"click_ids": True, "response_order": "action_first", "click_by": "id"}


@pytest.mark.parametrize(
    ("mode", "system", "extra"),
    [("single", "full", {}), ("cross", "full", {}), ("single", "brief", {}), ("single", "brief", FOR_A_SMALL_MODEL),
     ("cross", "full", FOR_A_SMALL_MODEL)],
)  # fmt: skip
def test_vectorised_builder_matches_the_renderer(mode, system, extra):
    world = random_world()
    settings = PromptSettings(
        window_single=4, window_cross=6, recent_clicks=3, recent_buys=2, max_reviews=2, review_chars=30,
        system=system, **extra,
    )  # fmt: skip
    # steps 0, 3, 6, ... have no rationale, odd steps of those are quarantined ones; every 4th
    # one of the rest is blank, which counts as none
    steps = world["steps"].select("session_id", "step")
    rationales = steps.filter(pl.col("step") % 3 != 0).with_columns(
        pl.when(pl.col("step") % 4 == 1)
        .then(pl.lit("  "))
        .otherwise(pl.format("Thought {} about it.", pl.col("step")))
        .alias("rationale")
    )
    quarantined = steps.filter((pl.col("step") % 3 == 0) & (pl.col("step") % 2 == 1))
    built = build_records(
        world["steps"],
        world["sessions"],
        item_texts(world["items"].lazy(), settings).collect(),
        mode=mode,
        history=world["history"],
        rationales=rationales,
        quarantined=quarantined,
        settings=settings,
    )
    by_id = {f"{s}:{k}": text for s, k, text in rationales.iter_rows()}
    expected = reference_records(world, mode, settings, by_id)
    assert built.height == len(expected) > 20
    for row in built.iter_rows(named=True):
        prompt, response = expected[row["record_id"]]
        assert row["prompt"] == prompt, row["record_id"]
        assert row["response"] == response
        step = row["step"]
        if step % 3 == 0:
            reason = "rationale_quarantined" if step % 2 == 1 else "rationale_missing"
        else:
            reason = "rationale_missing" if step % 4 == 1 else None
        assert row["gold_missing"] == reason, row["record_id"]
        assert (row["rationale"] is None) == (reason is not None)
        assert row["system"] == system_prompt(mode, settings.geometry, system, settings.response_order)
        assert row["token_estimate"] == token_estimate(row["system"], prompt, response or "")


def test_the_brief_system_turn_leaves_the_actions_to_each_state():
    brief, full = system_prompt("single", style="brief"), system_prompt("single")
    assert len(brief) < len(full) / 3 and "scroll_down" in full and "scroll_down" not in brief
    assert brief.endswith(
        '{"rationale": "<short first-person reason>", "action": {"type": "<action>", ...arguments}}'
    )
    assert "chained over time" in system_prompt("cross", style="brief")
    # the environment renders the same system turn the records hold
    state = golden_feed_state()
    assert render_state(state, PromptSettings(system="brief"))[0]["content"] == brief


# --- the hand-built lake: windows, recent lists, cross mode -------------------------------


def hand_lake() -> dict[str, pl.DataFrame]:
    """u1: s1 (7 steps, 10:00-10:06) then s2 (3 steps from 10:10); u2: s3 (3 steps)."""
    profile = dict.fromkeys(PROFILE_FIELDS, "x")

    def step(sid, user, i, minute, screen, action, split="train", **kw):
        row = dict(session_id=sid, user_id=user, step=i, ts=T0 + timedelta(minutes=minute), screen=screen)
        return row | dict(action=action, profile=profile, split=split, bucket=0, scroll_top=0) | kw

    ipv = dict(ipv_item_id="i_c", ipv_scroll=0, ui_state="main")
    rows = [
        step("s1", "u1", 0, 0, "feed", "scroll_down", visible_items=["i_a", "i_b"], distance=600),
        step(
            "s1",
            "u1",
            1,
            1,
            "feed",
            "click",
            scroll_top=600,
            visible_items=["i_b", "i_c"],
            target_item_id="i_c",
        ),
        step("s1", "u1", 2, 2, "ipv", "ipv_enter_comment", **ipv),
        step(
            "s1",
            "u1",
            3,
            3,
            "ipv",
            "ipv_click_comment",
            review_alias="C1",
            **(ipv | {"ui_state": "comments"}),
        ),
        step("s1", "u1", 4, 4, "ipv", "ipv_cart", **ipv),
        step("s1", "u1", 5, 5, "ipv", "back_home", **ipv),
        step("s1", "u1", 6, 6, "feed", "end", scroll_top=600, visible_items=["i_b", "i_c"]),
        step("s2", "u1", 0, 10, "feed", "click", visible_items=["i_a"], target_item_id="i_a"),
        step("s2", "u1", 1, 11, "ipv", "ipv_buy", **(ipv | {"ipv_item_id": "i_a"})),
        step("s2", "u1", 2, 12, "ipv", "end", **(ipv | {"ipv_item_id": "i_a"})),
        step("s3", "u2", 0, 0, "feed", "scroll_down", "val", visible_items=["i_a"], distance=400),
        step("s3", "u2", 1, 1, "feed", "scroll_up", "val", scroll_top=400, visible_items=[], distance=400),
        step("s3", "u2", 2, 2, "feed", "end", "val", visible_items=["i_a"]),
    ]
    items = [
        dict(item_id=i, title=t, price=10.0, category=f"{c}-x-y", category_l1=c, reviews=r)
        for i, t, c, r in [
            ("i_a", "Linen Shirt", "Apparel", []),
            ("i_b", "Ring", "Jewellery", []),
            ("i_c", "Tote", "Bags", ["ok"]),
        ]
    ]
    steps = typed(rows, STEPS)
    sessions = (
        steps.group_by("session_id", "user_id", "split", "bucket")
        .agg(
            pl.col("ts").min().alias("start_ts"), pl.col("ts").max().alias("end_ts"), pl.len().alias("length")
        )
        .with_columns(
            pl.lit(2000).alias("feed_height"), pl.lit([], dtype=pl.List(pl.String)).alias("categories")
        )
    )
    history = [
        dict(user_id="u1", ts=T0 - timedelta(days=2), kind="buy", title="Old Mug"),
        dict(user_id="u1", ts=T0 - timedelta(days=1), kind="click", title="Old Lamp"),
        dict(user_id="u1", ts=T0 + timedelta(days=1), kind="click", title="Future Click"),  # never shown
    ]
    return {
        "steps": steps,
        "sessions": typed(sessions.to_dicts(), SESSIONS),
        "items": typed(items, ITEMS),
        "history": typed(history, HISTORY),
    }


def section(prompt: str, header: str) -> str:
    body = prompt.split(header, 1)[1].split("\n\n## ", 1)[0]
    return body.split("\n\nChoose", 1)[0].strip("\n")


def test_cross_mode_window_spans_sessions_and_recent_lists_grow():
    lake = hand_lake()
    settings = PromptSettings(window_cross=6)
    records = build_records(
        lake["steps"],
        lake["sessions"],
        item_texts(lake["items"].lazy(), settings).collect(),
        mode="cross",
        history=lake["history"],
        settings=settings,
    ).sort("record_id")
    # only u1 has two sessions: 7 + 3 = 10 states, trajectory = user
    assert records.height == 10 and set(records["trajectory_id"]) == {"u1"}
    s2_step1 = records.filter(pl.col("record_id") == "s2:1")["prompt"][0]
    window = section(s2_step1, "oldest first)").splitlines()
    # 8 earlier steps (s1: 0..6, s2: 0), the last 6 shown: s1 steps 2..6, the session marker
    # (gap 10:10 - 10:06 = 4 min), s2 step 0
    assert len(window) == 7 and window[0].startswith("session 1 step 2:")
    assert window[-2] == "-- session 2 started 4 min after the previous one --"
    assert window[-1].startswith("session 2 step 0:")
    # recent clicks at s2: s1's click (Tote, 10:01) then the history click; the future one never shows
    assert section(s2_step1, "## Recent clicks (newest first)") == "- Tote\n- Old Lamp"
    assert section(s2_step1, "## Recent purchases (newest first)") == "- Old Mug"


def test_single_mode_window_stays_in_the_session():
    lake = hand_lake()
    settings = PromptSettings(window_single=10)
    records = build_records(
        lake["steps"],
        lake["sessions"],
        item_texts(lake["items"].lazy(), settings).collect(),
        mode="single",
        history=lake["history"],
        settings=settings,
    )
    assert records.height == 13
    s2_step0 = records.filter(pl.col("record_id") == "s2:0")["prompt"][0]
    # first step of s2: nothing earlier in this session; recent clicks only from history
    assert section(s2_step0, "oldest first)") == "(none yet)"
    assert section(s2_step0, "## Recent clicks (newest first)") == "- Old Lamp"
    s3 = records.filter(pl.col("session_id") == "s3").sort("step")
    # u2 has no history; scroll_up at offset 400 is shown, not at offset 0
    assert section(s3["prompt"][0], "## Recent clicks (newest first)") == "(none)"
    assert "- scroll_up" not in s3["prompt"][0] and "- scroll_up" in s3["prompt"][1]
    # intent reaches train rows only; s3 is val
    intents = pl.DataFrame({"trajectory_id": ["s1", "s3"], "intent": ["likes totes", "likes scarves"]})
    with_intent = build_records(
        lake["steps"], lake["sessions"], item_texts(lake["items"].lazy(), settings).collect(), intents=intents
    )
    by_session = dict(with_intent.group_by("session_id").agg(pl.col("intent").first()).iter_rows())
    assert by_session == {"s1": "likes totes", "s2": None, "s3": None}


def write_hand_lake(path: Path) -> None:
    lake = hand_lake()
    for name in ("steps", "sessions", "items", "history"):
        write_table(path, name, lake[name])


def test_write_records_and_export_before_extraction(tmp_path):
    write_hand_lake(tmp_path)
    summary = write_records(tmp_path, modes=["single", "cross"], chunk_states=4)
    # 13 single states + 10 cross states (u1 only); nothing recorded is unexecutable
    assert summary.records == 23 and summary.gold_not_executable == {}
    assert summary.gold_missing == {"rationale_missing": 23}  # no rationale exists yet
    records = read_lake_table(tmp_path, "records")
    assert records.height == 23 and records.select("mode", "record_id").is_unique().all()
    assert records["response"].is_null().all()  # an empty rationale is never a gold target
    out = tmp_path / "sft.jsonl"
    with pytest.raises(NothingToTrainOn) as stop:
        export_chat_jsonl(tmp_path, out, splits=["train"], modes=["single"])
    # train, single: s1 (7 states) + s2 (3 states), none with a rationale
    assert "nothing to train on yet" in str(stop.value) and "10 rationale_missing" in str(stop.value)
    assert stop.value.summary.left_out == {"rationale_missing": 10} and not out.exists()


def test_export_after_a_partly_failed_extraction(tmp_path):
    write_hand_lake(tmp_path)
    said = {f"s1:{k}": f"Reason {k} for this." for k in (0, 1, 3, 4, 5)} | {"s2:0": "Go.", "s2:1": "Buy."}
    said["s1:2"] = " "  # blank: no rationale at all
    rationales = [
        {"record_id": rid, "session_id": rid.split(":")[0], "step": int(rid.split(":")[1]), "rationale": text}
        for rid, text in said.items()
    ]
    write_table(tmp_path, "rationales", typed(rationales, RATIONALES))
    rejected = {"stage": "extract", "reason": "leakage", "kept": False}
    held = [rejected | {"payload": json.dumps({"record_id": "s1:6", "last_answer": "I bought it."})}]
    held.append(rejected | {"payload": json.dumps({"trajectory": "s1"})})  # an intent: no state of its own
    write_quarantine(tmp_path, "extract", typed(held, QUARANTINE))
    summary = write_records(tmp_path, modes=["single"])
    # single mode: 13 states; rationales for 7 (s1: 0, 1, 3, 4, 5; s2: 0, 1), s1:6 quarantined,
    # the rest missing: s1:2 (blank), s2:2, s3:0..2 -> 13 - 7 - 1 = 5
    assert summary.gold_missing == {"rationale_quarantined": 1, "rationale_missing": 5}
    out = tmp_path / "sft.jsonl"
    exported = export_chat_jsonl(tmp_path, out, splits=["train"], modes=["single"])
    # train (s1 + s2 = 10 states): 7 exported, 1 quarantined and 2 missing (s1:2, s2:2) left out
    assert exported.lines == 7 and exported.left_out == {"rationale_quarantined": 1, "rationale_missing": 2}
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(line["record_id"] for line in lines) == sorted(k for k in said if k != "s1:2")
    records = read_lake_table(tmp_path, "records").filter(pl.col("split") == "train")
    by_id = {r["record_id"]: r for r in records.iter_rows(named=True)}
    for line in lines:
        assert set(line) == {"record_id", "prompt", "completion"}  # TRL's conversational prompt-completion
        assert [m["role"] for m in line["prompt"]] == ["system", "user"]
        assert [m["role"] for m in line["completion"]] == ["assistant"]
        record = by_id[line["record_id"]]
        assert [m["content"] for m in line["prompt"]] == [record["system"], record["prompt"]]
        gold = json.loads(line["completion"][0]["content"])
        assert gold["rationale"] == said[line["record_id"]] and gold["rationale"].strip()
    exported_ids = {line["record_id"] for line in lines}
    assert exported.longest_token_estimate == max(by_id[k]["token_estimate"] for k in exported_ids)
    assert (
        exported.describe_left_out()
    ) == "left out 3 states without a gold rationale: 2 rationale_missing, 1 rationale_quarantined"


def test_export_refuses_records_that_cannot_tell_a_missing_rationale(tmp_path):
    write_hand_lake(tmp_path)
    write_records(tmp_path, modes=["single"])
    for part in table_files(tmp_path, "records"):  # as an older records stage wrote them
        pl.read_parquet(part, hive_partitioning=False).drop("gold_missing").write_parquet(part)
    with pytest.raises(ValueError, match="re-run `trajforge records` first"):
        export_chat_jsonl(tmp_path, tmp_path / "sft.jsonl")
    assert not (tmp_path / "sft.jsonl").exists()


def test_a_user_whose_steps_lie_in_several_files_renders_one_cross_session_history(tmp_path):
    # a bundle ingested in several parts: parts follow page views, so a user's steps lie in several
    # files of their bucket, and the cross-mode history must still cover every earlier session
    from synthetic.bundle import write_bundle as generate
    from transforms.config import IngestSettings
    from transforms.ingest import ingest_bundle
    from transforms.records import needed_items

    generate(tmp_path / "raw", users=12, seed=5)
    ingest_bundle(tmp_path / "raw", tmp_path / "lake", IngestSettings(spill_part_rows=3_000, buckets=2))
    lake = tmp_path / "lake"
    steps = read_lake_table(lake, "steps")
    files_per_user = pl.concat(
        [pl.read_parquet(p, hive_partitioning=False).select("user_id").unique().with_columns(
            pl.lit(str(p)).alias("file")) for p in table_files(lake, "steps")]
    ).group_by("user_id").len()  # fmt: skip
    assert files_per_user["len"].max() > 1
    write_records(lake, modes=["cross"], with_extraction=False)
    written = read_lake_table(lake, "records").sort("record_id")
    settings = PromptSettings()
    whole = build_records(
        steps, read_lake_table(lake, "sessions"), needed_items(lake, settings), mode="cross",
        history=read_lake_table(lake, "history"), settings=settings,
    ).sort("record_id")  # fmt: skip
    assert written["record_id"].to_list() == whole["record_id"].to_list()
    assert written["prompt"].to_list() == whole["prompt"].to_list()


def test_a_rendering_bucket_by_bucket_sums_to_its_table(tmp_path):
    from synthetic.bundle import write_bundle
    from transforms.ingest import ingest_bundle

    write_bundle(tmp_path / "raw", users=40, seed=3)
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    summary = write_records(tmp_path / "lake", modes=["single", "cross"], chunk_states=50)
    records = read_lake_table(tmp_path / "lake", "records")
    buckets = {path.parent.name for path in table_files(tmp_path / "lake", "records")}
    assert len(buckets) == 4 and summary.chunks > 2 * len(buckets)  # several chunks in every bucket
    assert summary.records == records.height
    by_mode_split = records.group_by("mode", "split").len().sort("mode", "split")
    assert summary.by_mode_split == {f"{m}/{s}": n for m, s, n in by_mode_split.iter_rows()}
    # the mean over every record, not a mean of the buckets' rounded means
    assert summary.token_estimate_mean == round(records["token_estimate"].sum() / records.height, 1)
    assert summary.token_estimate_max == records["token_estimate"].max()


def test_a_bucket_renders_the_rationales_and_intents_of_its_own_states(tmp_path):
    from extractors.config import ExtractSettings
    from extractors.pipeline import extract_lake
    from synthetic.bundle import write_bundle
    from transforms.ingest import ingest_bundle

    lake = tmp_path / "lake"
    write_bundle(tmp_path / "raw", users=40, seed=4)
    ingest_bundle(tmp_path / "raw", lake)
    write_records(lake, modes=["single", "cross"])
    extract_lake(lake, ExtractSettings(progress=False))  # the offline backend: every answer accepted
    write_records(lake, modes=["single", "cross"])
    records = read_lake_table(lake, "records")
    assert len({path.parent.name for path in table_files(lake, "records")}) == 4
    rationales = read_lake_table(lake, "rationales").select("session_id", "step")
    explained = records.join(rationales, on=["session_id", "step"], how="semi")
    assert explained.height == records.height and records["rationale"].is_not_null().all()
    intents = read_lake_table(lake, "intents").select("mode", "trajectory_id")
    train = records.filter(pl.col("split") == "train")
    with_intent = train.join(intents, on=["mode", "trajectory_id"], how="semi")
    assert with_intent.height > 0 and train["intent"].is_not_null().sum() == with_intent.height

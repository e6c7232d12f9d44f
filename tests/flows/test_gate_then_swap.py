"""Every stage gates its staged tables before they replace the lake's: a stopped gate leaves the
previous lake byte for byte, and the CLI prints one paragraph naming the table, the check and why."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import transforms.chain
from cli.app import app
from flows.chain import chain_flow
from flows.ingest import ingest_flow
from flows.records import records_flow
from flows.validate import validate_flow
from tests.bundles import event, feeds, tiny_bundle, write_bundle
from transforms.config import IngestSettings
from transforms.ingest.landed import landed_dir
from transforms.lake import STAGING, read_lake_table
from validation.report import GateError

runner = CliRunner()
# every gate run, a stopped one too, leaves its report here; everything else is the lake proper, the
# stages' Prefect cache included (a stopped stage leaves no record of its error there)
RUN_REPORTS = ("_runs/validation/", "_docs/")


def lake_files(lake: Path) -> dict[str, str]:
    """sha256 of every file of the lake but the gate's run reports and Prefect's records."""
    files = {p.relative_to(lake).as_posix(): p for p in lake.rglob("*") if p.is_file()}
    return {
        rel: hashlib.sha256(p.read_bytes()).hexdigest()
        for rel, p in sorted(files.items())
        if not rel.startswith(RUN_REPORTS)
    }


def unknown_actions(bundle: dict[str, list[dict]], event_ids: set[str]) -> dict[str, list[dict]]:
    bundle["events"] = [
        dict(e, action="teleport") if e["event_id"] in event_ids else e for e in bundle["events"]
    ]
    return bundle


@pytest.fixture
def good_lake(prefect_harness, tmp_path) -> tuple[Path, Path]:
    raw, lake = tmp_path / "raw", tmp_path / "lake"
    write_bundle(tiny_bundle(), raw)
    ingest_flow(str(raw), str(lake))
    chain_flow(str(lake))
    return raw, lake


def test_a_run_that_loses_every_event_stops_and_leaves_the_previous_lake(good_lake):
    raw, lake = good_lake
    before, landed = lake_files(lake), lake_files(landed_dir(lake))
    assert landed  # the rows a later day's ingest starts from, beside the lake
    every_event = {e["event_id"] for e in tiny_bundle()["events"]}
    write_bundle(unknown_actions(tiny_bundle(), every_event), raw)
    result = runner.invoke(app, ["ingest", str(raw), "--lake", str(lake)], env={"COLUMNS": "400"})
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    # 9 events of one session in, none kept: the first unknown action cuts the session before its
    # first step, so it is quarantined as unknown_action and the 8 after it as after_rejected_event
    assert "table 'events' failed expectation 'rows_kept'" in text
    assert "on 9 of 9 rows" in text
    assert "reason=after_rejected_event, rows=8" in text and "reason=unknown_action, rows=1" in text
    assert "Traceback" not in result.output
    assert lake_files(lake) == before
    assert not any((lake / STAGING).iterdir()), "the staged tables are gone"
    assert lake_files(landed_dir(lake)) == landed  # the landed rows as they were, none left staged
    assert sorted(p.name for p in lake.parent.iterdir()) == ["lake", "lake.landed", "raw"]


def test_a_failing_gate_after_a_good_run_leaves_the_previous_lake(good_lake):
    raw, lake = good_lake
    before = lake_files(lake)
    write_bundle(unknown_actions(tiny_bundle(), {"ev-8"}), raw)
    # the last of 9 events rejected (1/9 = 11 %) against an allowance of 5 %
    with pytest.raises(GateError, match="quarantined_share") as stop:
        ingest_flow(str(raw), str(lake), settings=IngestSettings(max_quarantined_share=0.05))
    assert "table 'events'" in str(stop.value) and "on 1 of 9 rows" in str(stop.value)
    assert lake_files(lake) == before
    # the same bundle under the default allowance (50 %) passes and replaces the tables
    ingest_flow(str(raw), str(lake))
    assert read_lake_table(lake, "steps").height == 8


def test_chain_keeping_no_user_stops_before_the_swap(good_lake, monkeypatch):
    _, lake = good_lake
    before = lake_files(lake)

    # a chain that drops every session: the lake's histories must survive its gate
    chain = transforms.chain.chain
    monkeypatch.setattr(transforms.chain, "chain", lambda sessions: chain(sessions.head(0)))
    with pytest.raises(GateError, match="table 'histories' failed expectation 'rows_kept'"):
        chain_flow(str(lake), reuse=False)  # every user chained (the sessions are unchanged)
    assert lake_files(lake) == before


def wide_scroll_bundle() -> dict[str, list[dict]]:
    """Two 900 px feed scrolls over a 3000 px feed: beyond the reference 694 px, within 1000."""
    bundle = tiny_bundle()
    bundle["feeds"] = [dict(card, feed_height=3000) for card in feeds()]
    bundle["events"] = [
        event("ev-0", 0, "feed", "scroll_down", scroll_top=0, scroll_delta=900),
        event("ev-1", 4, "feed", "scroll_up", scroll_top=900, scroll_delta=900),
        event("ev-2", 8, "feed", "end", scroll_top=0),
    ]
    return bundle


def test_a_toml_scroll_limit_is_honoured_by_alignment_gate_and_prompts(prefect_harness, tmp_path):
    raw, lake, config = tmp_path / "raw", tmp_path / "lake", tmp_path / "run.toml"
    write_bundle(wide_scroll_bundle(), raw)
    config.write_text("[ingest.geometry]\nmax_feed_scroll = 1000\n")
    ingested = runner.invoke(app, ["ingest", str(raw), "--lake", str(lake), "--config", str(config)])
    assert ingested.exit_code == 0, ingested.output
    steps = read_lake_table(lake, "steps").sort("step")
    assert steps["action"].to_list() == ["scroll_down", "scroll_up", "end"]
    assert steps["distance"].to_list() == [900, 900, None]
    # later stages and the on-demand gate read the limit from the lake's manifest, not the defaults
    chain_flow(str(lake))
    records_flow(str(lake))
    assert validate_flow(str(lake), ["steps"])["ok"]
    system = read_lake_table(lake, "records", ["system"])["system"]
    assert system.str.contains("integer 1..1000").all() and not system.str.contains("1..694").any()


def test_later_stages_read_the_settings_the_lake_was_ingested_with(tmp_path):
    from transforms.lake import recorded_settings
    from transforms.manifest import new_manifest, write_manifest

    assert recorded_settings(tmp_path) == IngestSettings(), "a lake no ingest recorded: the defaults"
    used = IngestSettings(action_map={"favourite": "ipv_cart"}, split_ratios=(0.5, 0.25, 0.25), buckets=2)
    write_manifest(
        new_manifest(
            tmp_path, "ingest", 1.0, {}, {}, settings=used.model_dump(mode="json", exclude={"rekey_key"})
        )
    )
    recorded = recorded_settings(tmp_path)
    assert recorded.action_map == {"favourite": "ipv_cart"} and recorded.split_ratios == (0.5, 0.25, 0.25)
    assert recorded.buckets == 2 and recorded.geometry == used.geometry

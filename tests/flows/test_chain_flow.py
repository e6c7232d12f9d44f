"""The chain and records flows under Prefect's test harness, on an ingested tiny bundle."""

from __future__ import annotations

from typer.testing import CliRunner

from cli.app import app
from extractors.config import ExtractSettings
from extractors.pipeline import extract_lake
from flows.chain import chain_flow
from flows.records import records_flow
from tests.bundles import event, feeds, tiny_bundle, write_bundle
from transforms.catalog import query
from transforms.fingerprints import fingerprint
from transforms.ingest import ingest_bundle
from transforms.manifest import manifest_path, read_manifest
from transforms.prompts import PromptSettings


def two_day_lake(tmp_path):
    """usr-1: pv-A (9 events, day 1) and pv-B (2 events, day 2)."""
    bundle = tiny_bundle()
    day = 86_400
    bundle["events"] += [
        event("b-0", day, "feed", "scroll_down", page_view_id="pv-B", scroll_top=0, scroll_delta=400),
        event("b-1", day + 5, "feed", "end", page_view_id="pv-B", scroll_top=400),
    ]
    bundle["feeds"] += feeds("pv-B")
    write_bundle(bundle, tmp_path / "raw")
    ingest_bundle(tmp_path / "raw", tmp_path / "lake")
    return str(tmp_path / "lake")


def test_chain_then_records_flows(prefect_harness, tmp_path):
    lake = two_day_lake(tmp_path)
    chained = chain_flow(lake)
    # one user with two sessions: one adjacent pair about a day apart (> 12 h)
    # one user with two sessions: one adjacent pair about a day apart (> 12 h), nothing clicked in pv-B
    stats = chained["stats"]
    assert (stats["users"], stats["sessions"], stats["actions"]) == (1, 2, 11)
    assert (stats["cross_users"], stats["adjacent_pairs"], stats["gap_over_12h_share"]) == (1, 1, 1.0)
    # pv-A clicked itm-5 (Apparel); pv-B clicked nothing, its top category is the most shown in
    # its feed: 4 Apparel vs 4 Bags cards, tie to the first card (itm-1, Apparel) -> continues
    assert (stats["continuation_rate"], stats["clicked_pairs"], stats["continuation_rate_clicked"]) == (
        1.0,
        0,
        None,
    )
    stored = read_manifest(lake, "chain")
    assert stored.details["stats"] == stats and stored.details["paper"]["continuation_rate"] == 0.578
    assert stored.inputs == {"sessions": fingerprint(f"{lake}/sessions")} and stored.read == ["sessions"]
    assert stored.outputs["histories"].rows == 1 and chained["manifest"].endswith("_runs/chain/manifest.json")
    assert query(lake, "SELECT n_sessions FROM histories")["n_sessions"].to_list() == [2]

    out = tmp_path / "sft.jsonl"
    # before extraction no state has a gold rationale: the export writes nothing and says why
    before = records_flow(lake, settings=PromptSettings(), export_jsonl=str(out), export_splits=None)
    assert before["export"]["nothing_to_train_on"].startswith("nothing to train on yet")
    # 11 single-session states + the same 11 in cross mode (the user has two sessions)
    stored = read_manifest(lake, "records")
    assert stored.details["records"]["records"] == 22 and stored.outputs["records"].rows == 22
    assert before["export"]["left_out"] == {"rationale_missing": 22}
    assert stored.users.read == 1 and stored.users.reused == 0  # the lake's one user, rendered
    assert not out.exists()
    refused = read_manifest(lake, "export")  # a refused export is recorded too, with nothing written
    assert (
        refused.outputs == {}
        and refused.details["nothing_to_train_on"] == before["export"]["nothing_to_train_on"]
    )

    extract_lake(lake, ExtractSettings(progress=False))  # the offline backend: every rationale accepted
    result = records_flow(lake, settings=PromptSettings(), export_jsonl=str(out), export_splits=None)
    assert result["records"]["records"] == 22 and result["records"]["gold_not_executable"] == {}
    assert result["export"]["lines"] == 22 and len(out.read_text().splitlines()) == 22
    assert result["export"]["left_out"] == {} and result["records"]["gold_missing"] == {}
    views = query(lake, "SELECT mode, count(*) AS n FROM records GROUP BY mode ORDER BY mode")
    assert views.rows() == [("cross", 11), ("single", 11)]
    again = read_manifest(lake, "records")
    assert again.details["records"]["records"] == 22 and again.inputs["rationales"] is not None
    # the export's manifest: the records it read, hash for hash, and the file it wrote
    exported = read_manifest(lake, "export")
    assert exported.inputs == {"records": again.outputs["records"].hash} and exported.read == ["records"]
    assert exported.outputs["chat_jsonl"].path == str(out) and exported.outputs[
        "chat_jsonl"
    ].hash == fingerprint(out)
    assert exported.details["lines"] == 22 and exported.settings == {"splits": None}
    assert result["export"]["manifest"] == str(manifest_path(lake, "export"))


def test_export_before_extraction_exits_non_zero(prefect_harness, tmp_path):
    lake = two_day_lake(tmp_path)
    out = tmp_path / "sft.jsonl"
    result = CliRunner().invoke(app, ["records", "--lake", lake, "--export-jsonl", str(out)])
    # the default export split is train; the one user's 11 + 11 states have no rationale yet
    assert result.exit_code == 1 and not out.exists()
    assert "nothing to train on yet" in result.output and "22 rationale_missing" in result.output
    assert "run `trajforge extract` first" in result.output


def test_export_counts_its_tokens_with_the_training_tokenizer(prefect_harness, tmp_path):
    import json

    from trainer.models import load_tokenizer, train_tokenizer

    lake = two_day_lake(tmp_path)
    records_flow(lake, settings=PromptSettings())
    extract_lake(lake, ExtractSettings(progress=False))
    out, folder = tmp_path / "sft.jsonl", tmp_path / "tokenizer"
    records_flow(lake, settings=PromptSettings(), export_jsonl=str(out), export_splits=None)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    texts = [m["content"] for line in lines for m in [*line["prompt"], *line["completion"]]]
    train_tokenizer(texts, vocab_size=400).save_pretrained(folder)
    result = CliRunner().invoke(
        app, ["records", "--lake", lake, "--export-jsonl", str(out), "--export-split", "all",
              "--export-tokenizer", str(folder)], env={"COLUMNS": "400"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    tokenizer = load_tokenizer(folder)
    longest = max(
        len(tokenizer.apply_chat_template([*x["prompt"], *x["completion"]], return_dict=True)["input_ids"])
        for x in lines
    )
    assert f"longest {longest:,}: max_length {longest:,} keeps every answer" in " ".join(
        result.output.split()
    )
    missing = CliRunner().invoke(app, ["records", "--lake", lake, "--export-jsonl", str(out),
                                       "--export-tokenizer", str(tmp_path)])  # fmt: skip
    assert missing.exit_code == 2 and "holds no tokenizer_config.json" in missing.output

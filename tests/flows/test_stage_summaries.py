"""Each stage's summary closes with the stage's own elapsed time, not the whole job's."""

from __future__ import annotations

import time

from rich.console import Console

from cli.console import print_chain_summary, print_ingest_summary, print_records_summary
from flows.chain import chain_flow
from flows.ingest import ingest_flow
from flows.records import records_flow
from tests.bundles import tiny_bundle, write_bundle


def test_each_stage_prints_its_own_elapsed_time(prefect_harness, tmp_path):
    raw, lake = tmp_path / "raw", str(tmp_path / "lake")
    write_bundle(tiny_bundle(), raw)
    started = time.perf_counter()
    ingested = ingest_flow(str(raw), lake)
    chained = chain_flow(lake)
    rendered = records_flow(lake)
    whole = time.perf_counter() - started
    stages = {"ingest": ingested, "chain": chained, "records": rendered}
    # three stages run one after another: each took a part of the whole, and together no more
    assert all(0 < s["seconds"] < whole for s in stages.values())
    assert sum(s["seconds"] for s in stages.values()) <= whole
    console = Console(record=True, width=200)
    print_ingest_summary(console, ingested)
    print_chain_summary(console, chained)
    print_records_summary(console, rendered)
    text = console.export_text()
    for stage, summary in stages.items():
        assert f"{stage} finished in {summary['seconds']:.1f}s" in text

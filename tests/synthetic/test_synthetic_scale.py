"""UserArena scale (11,010 shoppers): the counts and action mix of the paper.

Marked ``slow`` (about 20-40 s here); deselect with ``-m "not slow"``. Generation time is
measured by bench/ingest.py, never asserted here.
"""

from __future__ import annotations

import polars as pl
import pytest

from synthetic.bundle import write_bundle

USERS = 11_010  # DATA.md


@pytest.mark.slow
def test_userarena_scale_counts_and_mix(tmp_path):
    manifest = write_bundle(tmp_path / "raw", users=USERS, seed=42, fmt="parquet")
    counts = manifest["counts"]
    # 64,729 sessions and 577,670 actions in the paper; per-user session counts are drawn, so allow 3 %
    assert abs(counts["sessions"] / 64_729 - 1) < 0.03
    assert abs(counts["events"] / 577_670 - 1) < 0.03
    events = pl.read_parquet(tmp_path / "raw" / "events", columns=["action"])
    assert abs((events["action"] == "scroll_down").mean() - 0.3834) <= 0.03
    assert abs((events["action"] == "click").mean() - 0.1276) <= 0.03

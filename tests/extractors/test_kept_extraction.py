"""What an earlier extraction keeps for the users not extracted again (``KeptExtraction``): their
intents, rationales and quarantine rows of the bucket, each quarantine row traced to its user."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from extractors.pipeline import STAGE, KeptExtraction
from transforms.lake import write_quarantine, write_table
from transforms.schemas import INTENTS, QUARANTINE, RATIONALES, polars_schema

OWNERS = pl.DataFrame({"user_id": ["u1", "u1", "u2", "u3"], "session_id": ["s1", "s2", "s3", "s4"]})


def rows(schema, values: list[dict]) -> pl.DataFrame:
    """``values`` as a frame of ``schema``, every column they leave out null."""
    empty = polars_schema(schema).to_frame()
    frame = pl.DataFrame(values)
    return frame.with_columns(
        pl.lit(None, dtype=dtype).alias(name) for name, dtype in empty.schema.items() if name not in frame.columns
    ).select(empty.columns).cast(dict(empty.schema))  # fmt: skip


def held(bucket: int, table: str, payload: dict) -> dict:
    return {"table_name": table, "source_file": f"records/bucket={bucket}", "reason": "leakage",
            "payload": json.dumps(payload), "kept": False, "stage": STAGE}  # fmt: skip


def earlier_lake(tmp_path: Path, quarantined: list[dict]) -> Path:
    lake = tmp_path / "lake"
    write_table(lake, "intents", rows(INTENTS, [
        {"trajectory_id": "s1", "mode": "single", "user_id": "u1", "bucket": 0},
        {"trajectory_id": "u2", "mode": "cross", "user_id": "u2", "bucket": 0},
        {"trajectory_id": "s9", "mode": "single", "user_id": "u9", "bucket": 1},
    ]), schema=INTENTS)  # fmt: skip
    write_table(lake, "rationales", rows(RATIONALES, [
        {"record_id": "s1:0", "session_id": "s1", "user_id": "u1", "step": 0, "bucket": 0},
        {"record_id": "s3:0", "session_id": "s3", "user_id": "u2", "step": 0, "bucket": 0},
        {"record_id": "s4:0", "session_id": "s4", "user_id": "u3", "step": 0, "bucket": 0},
    ]), schema=RATIONALES)  # fmt: skip
    write_quarantine(lake, STAGE, rows(QUARANTINE, quarantined))
    return lake


def test_kept_users_keep_their_rows_and_quarantine_of_the_bucket(tmp_path: Path):
    lake = earlier_lake(tmp_path, [
        held(0, "rationales", {"record_id": "s2:4", "last_answer": "x"}),  # u1, a state
        held(0, "intents", {"trajectory": "cross:u3", "last_answer": "y"}),  # u3, a cross trajectory
        held(0, "intents", {"mode": "single", "trajectory_id": "s3"}),  # u2, a trajectory without steps
        held(1, "rationales", {"record_id": "s9:0"}),  # another bucket
    ])  # fmt: skip
    kept = KeptExtraction(lake, pl.Series(["u2"]))  # u2 is extracted again
    intents, rationales, quarantine = kept.rows(0, OWNERS)
    assert intents["user_id"].to_list() == ["u1"]
    assert sorted(rationales["record_id"]) == ["s1:0", "s4:0"]
    payloads = sorted(
        json.loads(p).get("record_id") or json.loads(p).get("trajectory") for p in quarantine["payload"]
    )
    assert payloads == ["cross:u3", "s2:4"]
    assert "user_id" not in quarantine.columns and set(quarantine["source_file"]) == {"records/bucket=0"}


def test_a_quarantine_row_naming_no_known_state_keeps_nothing(tmp_path: Path):
    lake = earlier_lake(tmp_path, [held(0, "rationales", {"record_id": "gone:1"})])
    assert KeptExtraction(lake, pl.Series(["u2"])).rows(0, OWNERS) is None


def test_without_an_earlier_quarantine_the_tables_alone_are_kept(tmp_path: Path):
    lake = earlier_lake(tmp_path, [])
    intents, rationales, quarantine = KeptExtraction(lake, pl.Series([], dtype=pl.String)).rows(0, OWNERS)
    assert (intents.height, rationales.height, quarantine.height) == (2, 3, 0)

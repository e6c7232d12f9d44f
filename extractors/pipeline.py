"""Extraction over the lake, one user-bucket partition at a time (plain Python; the flow wraps it).

Per bucket: read ``records`` (+ the users' ``steps`` and their ``items``) from the lake, or from a
lake-shaped ``states`` folder holding the records as rendered before any extraction (the pipeline's:
the prompts shown to the LLM are then the same on every run, whatever was extracted before), build
the intent jobs (train split only; one per (mode, trajectory)) and the rationale
jobs (one per recorded action), run the backend, then write into the stage's staging
folder (``transforms.lake.Staging``, laid out like the lake):

the bucket's intents / rationales / quarantine rows as partial files under
``STAGED/.staging/extract-parts/bucket=K/`` (assembled into tables by ``finalize``). The records
themselves have one writer, the records stage: rendered again after extraction, they carry the
rationales, gold responses and intents.

The lake itself is untouched until the staged tables are swapped in (the flow gates them
first), so a run killed at any point leaves the lake's previous tables. What it paid for
is in the response cache: a re-run rebuilds the staged tables from it without asking again.

Accounting per bucket and kind: jobs = ok + quarantined + pending. Pending jobs
(budget spent, endpoint refusing us) are not failures: a re-run resumes them,
and the response cache serves everything already paid for.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import polars as pl
import pyarrow.parquet as pq
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from extractors.answer import AnswerOutcome
from extractors.cache import ResponseCache
from extractors.client import Budget, LLMClient, Stats
from extractors.config import ExtractSettings
from extractors.intent import intent_heuristic, intent_llm
from extractors.rationale import CHECKS, rationale_heuristic, rationale_llm
from extractors.schemas import Intent, RationaleAnswer
from extractors.trajectory import STEP_COLUMNS, IntentJob, RationaleJob, Timeline, build_timelines
from transforms.files import atomic_file
from transforms.fingerprints import fingerprint
from transforms.lake import (
    STAGING,
    Staging,
    conform,
    quarantine_dir,
    scan_table,
    table_dir,
    table_files,
    write_quarantine,
    write_table,
)
from transforms.manifest import UsersDone, new_manifest, write_manifest
from transforms.schemas import INTENTS, QUARANTINE, RATIONALES, polars_schema

STAGE = "extract"
PARTS = Path(STAGING) / "extract-parts"  # scratch of a staging folder: never swapped into the lake
KINDS = ("intents", "rationales")
TABLES = ("intents", "rationales")  # what the stage writes (besides its quarantine rows)
T = TypeVar("T")


# --- reports -----------------------------------------------------------------------------------


@dataclass
class Carry:
    """What one bucket hands to the next: the budget spent so far and whether sending has stopped."""

    spent_usd: float = 0.0
    spent_tokens: int = 0
    stopped: str | None = None


@dataclass
class BucketReport:
    bucket: int
    counts: dict[str, dict[str, int]]  # kind -> jobs / ok / quarantined / pending
    stats: dict[str, Any]
    quarantine_by_reason: dict[str, int]
    carry: Carry = field(default_factory=Carry)
    users: dict[str, int] = field(default_factory=dict)  # extracted (read) / kept from before (reused)
    pending_users: list[str] = field(default_factory=list)  # users with a job left for a re-run

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BucketReport:
        return cls(**{**data, "carry": Carry(**data["carry"])})


def record_buckets(states: str | Path) -> list[int]:
    """Buckets of the records table of ``states`` (a lake, or a lake-shaped folder; hive ``bucket=K``)."""
    parents = {f.parent.name for f in table_files(states, "records")}
    return sorted(int(p.split("=", 1)[1]) for p in parents if p.startswith("bucket="))


# --- loading -----------------------------------------------------------------------------------


def load_bucket(
    lake: str | Path, bucket: int, states: str | Path | None = None, only_users: pl.Series | None = None
) -> tuple[pl.DataFrame, dict[str, Timeline]]:
    """One bucket's records (from ``states`` when given, else the lake's; of ``only_users`` when
    given) and its users' timelines."""
    records = scan_table(states or lake, "records").filter(pl.col("bucket") == bucket)
    if only_users is not None:
        records = records.filter(pl.col("user_id").is_in(only_users.implode()))
    records = records.collect()
    users = records["user_id"].unique()
    steps = scan_table(lake, "steps", STEP_COLUMNS).filter(pl.col("user_id").is_in(users)).collect()
    shown = pl.concat(
        [steps["visible_items"].explode(), steps["ipv_item_id"], steps["target_item_id"]]
    ).drop_nulls()
    items = scan_table(lake, "items").filter(pl.col("item_id").is_in(shown.unique())).collect()
    return records, build_timelines(steps, items)


def intent_jobs(records: pl.DataFrame, timelines: dict[str, Timeline]) -> list[IntentJob]:
    """One job per (mode, trajectory) of the train split, sessions in time order."""
    train = records.filter(pl.col("split") == "train")
    groups = train.group_by("mode", "trajectory_id", maintain_order=True).agg(
        pl.col("user_id").first(), pl.col("session_id").unique(maintain_order=True), pl.col("bucket").first()
    )
    jobs = []
    for row in groups.iter_rows(named=True):
        timeline = timelines.get(row["user_id"])
        if timeline is None:
            continue  # no steps at all for this user: quarantined by missing_steps()
        order = {s: i for i, s in enumerate(timeline.sessions())}
        sessions = tuple(sorted((s for s in row["session_id"] if s in order), key=order.__getitem__))
        jobs.append(
            IntentJob(row["trajectory_id"], row["mode"], row["user_id"], sessions, row["bucket"], timeline)
        )
    return jobs


def rationale_jobs(records: pl.DataFrame, timelines: dict[str, Timeline]) -> list[RationaleJob]:
    """One job per recorded action; when a step appears in both modes the single-mode prompt is used."""
    distinct = records.sort(pl.col("mode") != "single", maintain_order=True).unique(
        "record_id", keep="first", maintain_order=True
    )
    jobs = []
    for r in distinct.iter_rows(named=True):
        timeline = timelines.get(r["user_id"])
        if timeline is None or (r["session_id"], r["step"]) not in timeline.position:
            continue
        jobs.append(
            RationaleJob(
                r["record_id"], r["session_id"], r["user_id"], r["step"], r["split"], r["bucket"],
                r["action"], r["action_json"], r["prompt"], timeline,
            )
        )  # fmt: skip
    return jobs


def missing_steps(records: pl.DataFrame, i_jobs: list[IntentJob], r_jobs: list[RationaleJob]) -> pl.DataFrame:
    """Trajectories and records without rows in ``steps``: quarantined, never silently dropped."""
    have_i = pl.DataFrame(
        {"mode": [j.mode for j in i_jobs], "trajectory_id": [j.trajectory_id for j in i_jobs]},
        schema={"mode": pl.String, "trajectory_id": pl.String},
    )
    lost_i = (
        records.filter(pl.col("split") == "train")
        .unique(["mode", "trajectory_id"], maintain_order=True)
        .join(have_i, on=["mode", "trajectory_id"], how="anti")
        .with_columns(pl.lit("intents").alias("table_name"), pl.struct("mode", "trajectory_id").alias("_key"))
    )
    have_r = pl.Series("record_id", [j.record_id for j in r_jobs], dtype=pl.String)
    lost_r = (
        records.filter(~pl.col("record_id").is_in(have_r))
        .unique("record_id", maintain_order=True)
        .with_columns(
            pl.lit("rationales").alias("table_name"),
            pl.struct("record_id", "session_id", "step").alias("_key"),
        )
    )
    return pl.concat([lost_i, lost_r], how="diagonal_relaxed").select(
        "table_name",
        pl.format("records/bucket={}", pl.col("bucket")).alias("source_file"),
        pl.lit(None, dtype=pl.Int64).alias("source_row"),
        pl.lit("missing_step").alias("reason"),
        pl.lit("no rows in steps for this record / trajectory").alias("detail"),
        pl.col("_key").struct.json_encode().alias("payload"),
        pl.lit(False).alias("kept"),
    )


# --- running the backend ---------------------------------------------------------------------


def _progress(settings: ExtractSettings) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not settings.progress,
    )


async def _drain(
    jobs: Sequence[T], run: Callable[[T], Awaitable[Any]], workers: int, tick: Callable[[], None]
) -> list:
    """Run ``jobs`` with at most ``workers`` in flight; results in job order."""
    results: list[Any] = [None] * len(jobs)
    queue = iter(enumerate(jobs))

    async def worker() -> None:
        for i, job in queue:  # the shared iterator hands each job to exactly one worker
            results[i] = await run(job)
            tick()

    await asyncio.gather(*(worker() for _ in range(min(workers, len(jobs)))))
    return results


async def _run_openai(
    settings: ExtractSettings,
    cache: ResponseCache | None,
    carry: Carry,
    jobs: tuple[list, list],
    tick: Callable[[], None],
) -> tuple[list[AnswerOutcome[Intent]], list[AnswerOutcome[RationaleAnswer]], Stats, Budget]:
    stats = Stats(stopped=carry.stopped)
    budget = Budget.from_settings(settings, spent_usd=carry.spent_usd, spent_tokens=carry.spent_tokens)
    async with LLMClient(settings, cache=cache, stats=stats, budget=budget) as client:
        intents = await _drain(jobs[0], lambda j: intent_llm(client, j), settings.concurrency, tick)
        rationales = await _drain(jobs[1], lambda j: rationale_llm(client, j), settings.concurrency, tick)
    return intents, rationales, stats, budget


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` that also works when the caller already runs an event loop (e.g. inside a flow)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="extract-loop")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def run_backend(
    settings: ExtractSettings,
    lake: str | Path,
    carry: Carry,
    intents: list[IntentJob],
    rationales: list[RationaleJob],
    label: str,
) -> tuple[list[AnswerOutcome[Intent]], list[AnswerOutcome[RationaleAnswer]], Stats, Carry]:
    with _progress(settings) as bar:
        task = bar.add_task(label, total=len(intents) + len(rationales))

        def tick() -> None:
            bar.advance(task)

        if settings.backend == "heuristic":
            stats = Stats()
            out_i = [_tick(intent_heuristic(j, stats), tick) for j in intents]
            out_r = [
                _tick(rationale_heuristic(j, stats, settings.rationale_max_words), tick) for j in rationales
            ]
            return out_i, out_r, stats, carry
        cache = ResponseCache.in_lake(lake) if settings.cache else None
        out_i, out_r, stats, budget = run_sync(
            _run_openai(settings, cache, carry, (intents, rationales), tick)
        )
        return out_i, out_r, stats, Carry(budget.spent_usd, budget.spent_tokens, stats.stopped)


def _tick(value: T, tick: Callable[[], None]) -> T:
    tick()
    return value


# --- output frames -----------------------------------------------------------------------------


def _provenance(o: AnswerOutcome) -> dict[str, Any]:
    p = o.provenance
    return {
        "backend": p.backend,
        "model": p.model,
        "prompt_version": p.prompt_version,
        "prompt_hash": p.prompt_hash,
        "request_key": p.request_key,
        "tokens_in": p.tokens_in,
        "tokens_out": p.tokens_out,
        "attempts": p.attempts,
        "cached": p.cached,
        "violations": o.rejected_codes(),
    }


def intents_frame(jobs: list[IntentJob], outcomes: list[AnswerOutcome[Intent]]) -> pl.DataFrame:
    rows = [
        {
            "trajectory_id": j.trajectory_id,
            "mode": j.mode,
            "user_id": j.user_id,
            "session_ids": list(j.session_ids),
            "split": "train",
            "anchors": [a.model_dump() for a in o.value.anchors],
            "intent_text": o.value.render(),
            "leakage_verdict": "clean",  # only checked answers are kept; earlier rejects in violations
            "bucket": j.bucket,
            **_provenance(o),
        }
        for j, o in zip(jobs, outcomes, strict=True)
        if o.status == "ok" and o.value is not None
    ]
    return _frame(rows, INTENTS)


def rationales_frame(
    jobs: list[RationaleJob], outcomes: list[AnswerOutcome[RationaleAnswer]]
) -> pl.DataFrame:
    rows = [
        {
            "record_id": j.record_id,
            "session_id": j.session_id,
            "user_id": j.user_id,
            "step": j.step,
            "action": j.action,
            "rationale": o.value.rationale,
            "split": j.split,
            "checks_passed": list(CHECKS),
            "bucket": j.bucket,
            **_provenance(o),
        }
        for j, o in zip(jobs, outcomes, strict=True)
        if o.status == "ok" and o.value is not None
    ]
    return _frame(rows, RATIONALES)


def _frame(rows: list[dict[str, Any]], schema: Any) -> pl.DataFrame:
    """Rows as a frame of ``schema``; columns the rows do not mention are null."""
    empty = polars_schema(schema).to_frame()
    if not rows:
        return empty
    known = {name: dtype for name, dtype in empty.schema.items() if name in rows[0]}
    frame = pl.DataFrame(rows, schema=known)
    return frame.with_columns(
        pl.lit(None, dtype=dtype).alias(name) for name, dtype in empty.schema.items() if name not in known
    ).select(empty.columns)


def quarantine_frame(
    bucket: int, kind: str, keys: list[str], outcomes: list[AnswerOutcome], id_name: str
) -> pl.DataFrame:
    rows = [
        {
            "table_name": kind,
            "source_file": f"records/bucket={bucket}",
            "source_row": None,
            "reason": o.reason,
            "detail": o.detail(),
            "payload": json.dumps({id_name: key, "last_answer": o.last_text}, ensure_ascii=False),
            "kept": False,
        }
        for key, o in zip(keys, outcomes, strict=True)
        if o.status == "quarantined"
    ]
    return _frame(rows, QUARANTINE).drop("stage")


# --- what an earlier extraction keeps --------------------------------------------------------


@dataclass(frozen=True)
class KeptExtraction:
    """The lake's extraction outputs as an earlier run left them; every user not in ``replaced``
    keeps their intents, rationales and quarantine rows from it."""

    lake: Path
    replaced: pl.Series

    def rows(self, bucket: int, records: pl.DataFrame) -> tuple[pl.DataFrame, ...] | None:
        """(intents, rationales, quarantine) of the bucket's kept users; None when a quarantine row
        of the bucket names no state of its records (nothing is kept then: every user is extracted)."""
        kept_users = records.filter(~pl.col("user_id").is_in(self.replaced.implode()))["user_id"].unique()
        mine = (pl.col("bucket") == bucket) & pl.col("user_id").is_in(kept_users.implode())
        intents = self._table("intents", INTENTS).filter(mine).collect()
        rationales = self._table("rationales", RATIONALES).filter(mine).collect()
        quarantine = self._quarantine(bucket, records)
        if quarantine["user_id"].null_count():
            return None
        kept_quarantine = quarantine.filter(pl.col("user_id").is_in(kept_users.implode())).drop("user_id")
        return intents, rationales, kept_quarantine

    def _table(self, name: str, schema: Any) -> pl.LazyFrame:
        return scan_table(self.lake, name) if table_files(self.lake, name) else _frame([], schema).lazy()

    def _quarantine(self, bucket: int, records: pl.DataFrame) -> pl.DataFrame:
        """The bucket's quarantine rows of the earlier run, each with the user its state belongs to."""
        files = sorted(quarantine_dir(self.lake, STAGE).glob("*.parquet"))
        if not files:
            return _frame([], QUARANTINE).drop("stage").with_columns(pl.lit(None, pl.String).alias("user_id"))
        rows = pl.scan_parquet(files, hive_partitioning=False).filter(
            pl.col("source_file") == f"records/bucket={bucket}"
        )
        payload = pl.col("payload")
        named = pl.coalesce(  # a state's session, or a trajectory's id (a session or a user)
            payload.str.json_path_match("$.record_id").str.extract(r"^(.*):\d+$"),
            payload.str.json_path_match("$.trajectory").str.extract(r"^[a-z]+:(.*)$"),
            payload.str.json_path_match("$.trajectory_id"),
        )
        owners = pl.concat(
            [
                records.select(pl.col("session_id").alias("_named"), "user_id"),
                records.select(pl.col("user_id").alias("_named"), "user_id"),
            ]
        ).unique("_named")
        return (
            rows.drop("stage")
            .with_columns(named.alias("_named"))
            .join(owners.lazy(), on="_named", how="left")
            .drop("_named")
            .collect()
        )


# --- writing ---------------------------------------------------------------------------------


def _write_parquet(frame: pl.DataFrame, schema: Any, path: Path) -> None:
    with atomic_file(path) as temporary:
        pq.write_table(conform(frame, schema), temporary, compression="zstd", compression_level=3)


def part_path(staged: str | Path, bucket: int, name: str) -> Path:
    return Path(staged) / PARTS / f"bucket={bucket}" / f"{name}.parquet"


# --- one bucket, and the whole run ---------------------------------------------------------------


def _counts(outcomes: list[AnswerOutcome]) -> dict[str, int]:
    c = Counter(o.status for o in outcomes)
    return {"jobs": len(outcomes), "ok": c["ok"], "quarantined": c["quarantined"], "pending": c["pending"]}


def extract_bucket(
    lake: str | Path,
    bucket: int,
    settings: ExtractSettings,
    carry: Carry | None = None,
    *,
    staged: str | Path,
    states: str | Path | None = None,
    kept: KeptExtraction | None = None,
) -> BucketReport:
    """Extract one bucket of ``lake`` and write its outputs into ``staged``; see the module docstring.
    With ``kept``, only its ``replaced`` users are extracted, the others keep their earlier rows."""
    earlier, bucket_users = None, 0
    if kept is not None:
        owners = scan_table(states or lake, "records").filter(pl.col("bucket") == bucket)
        owners = owners.select("user_id", "session_id").unique().collect()
        earlier, bucket_users = kept.rows(bucket, owners), owners["user_id"].n_unique()
    only = kept.replaced if kept is not None and earlier is not None else None
    records, timelines = load_bucket(lake, bucket, states, only)
    i_jobs, r_jobs = intent_jobs(records, timelines), rationale_jobs(records, timelines)
    label = f"extract bucket {bucket} ({settings.backend})"
    i_out, r_out, stats, carry = run_backend(settings, lake, carry or Carry(), i_jobs, r_jobs, label)
    intents, rationales = intents_frame(i_jobs, i_out), rationales_frame(r_jobs, r_out)
    quarantine = pl.concat(
        [
            quarantine_frame(
                bucket, "intents", [f"{j.mode}:{j.trajectory_id}" for j in i_jobs], i_out, "trajectory"
            ),
            quarantine_frame(bucket, "rationales", [j.record_id for j in r_jobs], r_out, "record_id"),
            missing_steps(records, i_jobs, r_jobs),
        ],
        how="diagonal",  # aligned by column name
    )
    counts = {"intents": _counts(i_out), "rationales": _counts(r_out)}
    for kind in KINDS:  # jobs that could not even be built count as jobs, quarantined
        lost = quarantine.filter((pl.col("table_name") == kind) & (pl.col("reason") == "missing_step")).height
        counts[kind]["jobs"] += lost
        counts[kind]["quarantined"] += lost
    extracted_users = records["user_id"].n_unique()
    if earlier is not None:
        intents, rationales, quarantine = _with_earlier(counts, (intents, rationales, quarantine), earlier)
    _write_parquet(intents, INTENTS, part_path(staged, bucket, "intents"))
    _write_parquet(rationales, RATIONALES, part_path(staged, bucket, "rationales"))
    _write_parquet(
        quarantine.with_columns(pl.lit(STAGE).alias("stage")),
        QUARANTINE,
        part_path(staged, bucket, "quarantine"),
    )
    by_reason = Counter(f"{t}:{r}" for t, r in quarantine.select("table_name", "reason").iter_rows())
    pending = {j.user_id for j, o in [*zip(i_jobs, i_out, strict=True), *zip(r_jobs, r_out, strict=True)]
               if o.status == "pending"}  # fmt: skip
    users = {"read": extracted_users, "reused": 0 if earlier is None else bucket_users - extracted_users}
    return BucketReport(bucket, counts, stats.as_dict(), dict(sorted(by_reason.items())), carry, users,
                        sorted(pending))  # fmt: skip


def _with_earlier(
    counts: dict[str, dict[str, int]], fresh: tuple[pl.DataFrame, ...], earlier: tuple[pl.DataFrame, ...]
) -> tuple[pl.DataFrame, ...]:
    """This run's rows and the kept users' earlier ones together; their decided jobs join the counts
    (each kept row was one job: answered, or quarantined)."""
    intents, rationales, quarantine = earlier
    for kind, accepted in (("intents", intents), ("rationales", rationales)):
        held = quarantine.filter(pl.col("table_name") == kind).height
        counts[kind]["jobs"] += accepted.height + held
        counts[kind]["ok"] += accepted.height
        counts[kind]["quarantined"] += held
    together = zip(fresh, earlier, strict=True)
    return tuple(pl.concat([new, old], how="diagonal_relaxed") for new, old in together)


def finalize(
    lake: str | Path,
    settings: ExtractSettings,
    reports: list[BucketReport],
    started: str,
    *,
    staged: str | Path,
) -> dict[str, Any]:
    """Assemble the partial outputs in ``staged`` into its ``intents``, ``rationales`` and quarantine
    tables; returns the run's summary (recorded in the stage's manifest once the tables are swapped in)."""
    buckets = [r.bucket for r in reports]
    for name in KINDS:
        parts = [pl.read_parquet(part_path(staged, b, name)) for b in buckets]
        schema = INTENTS if name == "intents" else RATIONALES
        write_table(staged, name, pl.concat(parts) if parts else _frame([], schema), schema=schema)
    quarantine = [pl.read_parquet(part_path(staged, b, "quarantine")) for b in buckets]
    write_quarantine(staged, STAGE, pl.concat(quarantine) if quarantine else _frame([], QUARANTINE))
    return summarize(lake, settings, reports, started)


def kept_rows(summary: dict[str, Any]) -> dict[str, dict[str, int]]:
    """The gate's accounting per output table: jobs decided this run in, answers accepted out (pending
    jobs were not decided: a budget stop before the first answer keeps nothing and loses nothing)."""
    return {
        kind: {"rows_in": c["jobs"] - c["pending"], "rows_out": c["ok"]}
        for kind, c in summary["counts"].items()
    }


def summarize(
    lake: str | Path, settings: ExtractSettings, reports: list[BucketReport], started: str
) -> dict[str, Any]:
    counts = {k: dict(sum((Counter(r.counts[k]) for r in reports), Counter())) for k in KINDS}
    for k in KINDS:  # a Counter sum drops zeros: keep every field
        counts[k] = {f: counts[k].get(f, 0) for f in ("jobs", "ok", "quarantined", "pending")}
    return {
        "stage": STAGE,
        "lake": str(lake),
        "backend": settings.backend,
        "model": settings.model if settings.backend == "openai" else "rules",
        "started_at": started,
        "finished_at": datetime.now(UTC).isoformat(),
        "buckets": [r.bucket for r in reports],
        "counts": counts,
        "balanced": all(c["jobs"] == c["ok"] + c["quarantined"] + c["pending"] for c in counts.values()),
        **merge_stats([r.stats for r in reports]),
        "budget_usd": settings.budget_usd,
        "lake_cost_usd": lake_spend(lake, settings),
        "quarantine_by_reason": dict(sum((Counter(r.quarantine_by_reason) for r in reports), Counter())),
        "stopped": next((r.carry.stopped for r in reports if r.carry.stopped), None),
        # users extracted this run (read) and users whose earlier rows were kept (reused)
        "users": {key: sum(r.users.get(key, 0) for r in reports) for key in ("read", "reused")},
        "settings": settings.model_dump(mode="json"),
    }


def lake_spend(lake: str | Path, settings: ExtractSettings) -> float | None:
    """What this lake's extraction has cost over all its runs: each answer in its response cache was
    paid for once, at the prices of its run. None when the cache is off (nothing is kept to add up)."""
    if not settings.cache:
        return None
    return round(ResponseCache.in_lake(lake).spent_usd, 6)


def merge_stats(parts: list[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for key in (
        "requests",
        "cache_hits",
        "answers",
        "retries_total",
        "tokens_in",
        "tokens_out",
        "reasks",
        "recovered_json",
        "format_fallbacks",
    ):
        total[key] = sum(p[key] for p in parts)
    total["cost_usd"] = round(sum(p["cost_usd"] for p in parts), 6)
    for key in ("retries", "rejects"):
        total[key] = dict(sorted(sum((Counter(p[key]) for p in parts), Counter()).items()))
    return total


def extract_lake(
    lake: str | Path, settings: ExtractSettings, states: str | Path | None = None
) -> dict[str, Any]:
    """The whole stage without Prefect and without the validation gate: staged, then swapped in
    (the flow runs the same steps as tasks and gates the staged tables before its swap)."""
    started, clock = datetime.now(UTC).isoformat(), time.perf_counter()
    read_from = {"states": fingerprint(states or table_dir(lake, "records"))}
    staging = Staging(lake)
    staged = staging.open()
    try:
        reports: list[BucketReport] = []
        carry = Carry()
        for bucket in record_buckets(states or lake):
            reports.append(extract_bucket(lake, bucket, settings, carry, staged=staged, states=states))
            carry = reports[-1].carry
        summary = finalize(lake, settings, reports, started, staged=staged)
        staging.commit()
    finally:
        staging.discard()
    written = {name: table_dir(lake, name) for name in KINDS} | {"quarantine": quarantine_dir(lake, STAGE)}
    manifest = new_manifest(
        lake, STAGE, time.perf_counter() - clock, read_from, written, users=UsersDone(**summary["users"]),
        settings=summary["settings"], details=summary,
    )  # fmt: skip
    write_manifest(manifest)
    return summary

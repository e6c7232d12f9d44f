"""Benchmark: the stages mapped over parts or buckets (ingest, chain, records) on the local runner and
on a local Ray cluster, time per part or bucket, the reduce's share, and a projection to larger logs on
more workers.

Builds a generated bundle of ``--users`` shoppers (10x UserArena by default), then under each runner in
turn, in this process under Prefect's ephemeral API: ``ingest_bundle_flow`` into a lake of its own
(``--buckets`` user buckets; on Ray each part of pass 2 is a task), then ``chain_flow`` and
``records_flow`` (every user, as a first run does) on a lake ingested once beforehand. Per part or
bucket, the Prefect task runs' own start and end times: the stage's work and, where the gate checks the
buckets side by side (Ray), the gate's; the rest of a flow's wall time (ingest's pass 1 and item index,
statistics, the gate's whole-table checks and combining, swap, catalog, manifest) is its reduce. The RSS
of this process and of every Ray worker is sampled every 0.5 s, stage by stage. Writes
bench/results/scale.json.

    python bench/scale.py                         # 110,100 shoppers, 8 buckets, local + ray (2 CPUs)
    python bench/scale.py --users 2000 --buckets 4
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from hostinfo import describe  # bench/ is the script's folder

RESULTS = Path(__file__).with_name("results") / "scale.json"
STAGES = {"ingest": "ingest-align-part", "chain": "chain-bucket", "records": "render-records-bucket"}
NESTED = {"ingest"}  # stages whose map runs inside one of the flow's tasks (``ingest-tables``)
GATE_PARTS = "validation-gate-bucket"
USERARENA_USERS = 11_010


class RssSampler:
    """Peak RSS of this process and, apart, of the largest Ray worker, sampled in a thread."""

    def __init__(self, every_s: float = 0.5) -> None:
        self.every_s, self.driver, self.worker = every_s, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            self.driver = max(self.driver, me.memory_info().rss)
            for process in psutil.process_iter(["name", "memory_info"]):
                name = process.info["name"] or ""
                if name.startswith("ray::") and process.info["memory_info"] is not None:
                    self.worker = max(self.worker, process.info["memory_info"].rss)
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def build_lake(work: Path, users: int, buckets: int, seed: int) -> Path:
    from synthetic.bundle import write_bundle
    from transforms.config import IngestSettings
    from transforms.ingest import ingest_bundle

    raw, lake = raw_bundle(work, users), work / f"lake-{users}-{buckets}"
    if not (raw / "manifest.json").is_file():
        write_bundle(raw, users=users, seed=seed, overwrite=True)
    if not all((lake / name).is_dir() for name in ("steps", "sessions", "items")):
        shutil.rmtree(lake, ignore_errors=True)
        ingest_bundle(raw, lake, IngestSettings(buckets=buckets))
    return lake


def raw_bundle(work: Path, users: int) -> Path:
    return work / f"raw-{users}"


def task_runs(flow_run_id: Any) -> list[dict[str, Any]]:
    """The flow run's task runs: name, start and end (epoch seconds)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [
        {"name": r.name, "start": r.start_time.timestamp(), "end": r.end_time.timestamp()}
        for r in runs
        if r.start_time and r.end_time
    ]


def run_stage(stage: str, lake: Path, raw: Path, buckets: int) -> dict[str, Any]:
    from flows.chain import chain_flow
    from flows.ingest import ingest_bundle_flow
    from flows.records import records_flow
    from transforms.config import IngestSettings

    started = time.time()
    if stage == "ingest":  # into a lake of its own, every run from nothing
        ingested = lake.with_name(f"{lake.name}-ingest")
        shutil.rmtree(ingested, ignore_errors=True)
        settings = IngestSettings(buckets=buckets)
        state = ingest_bundle_flow(str(raw), str(ingested), settings, return_state=True)
    else:
        flow = chain_flow if stage == "chain" else records_flow
        state = flow(str(lake), reuse=False, return_state=True)
    ended = time.time()
    state.result()  # raises what the flow raised
    runs = task_runs(state.state_details.flow_run_id)
    buckets = [r for r in runs if r["name"].startswith(f"{STAGES[stage]}-")]
    # the gate's own map: a task run per bucket inside the gate's task run (on Ray, or several local
    # workers); none where the gate reads the table in its own process
    gated = [r for r in runs if r["name"].startswith(f"{GATE_PARTS}-")]
    others = [r for r in runs if r not in buckets and r not in gated]
    seconds = sorted(r["end"] - r["start"] for r in buckets) or [0.0]  # none: ingest in one process
    span = max(r["end"] for r in buckets) - min(r["start"] for r in buckets) if buckets else 0.0
    gate_span = max(r["end"] for r in gated) - min(r["start"] for r in gated) if gated else 0.0
    reduce = sum(r["end"] - r["start"] for r in others) - gate_span - (span if stage in NESTED else 0.0)
    wall = ended - started
    return {
        "wall_s": round(wall, 2),
        "buckets": len(buckets),
        "bucket_s": [round(s, 2) for s in seconds],
        "bucket_median_s": round(statistics.median(seconds), 2),
        "map_span_s": round(span, 2),
        "gate_bucket_s": sorted(round(r["end"] - r["start"], 2) for r in gated),
        "gate_bucket_median_s": round(statistics.median(r["end"] - r["start"] for r in gated), 2)
        if gated
        else 0.0,
        "gate_map_span_s": round(gate_span, 2),
        # the flow's other tasks: the summary, the gate (less its map), the swap, the catalog, the manifest
        "reduce_s": round(reduce, 2),
        "reduce_tasks": sorted({r["name"].rsplit("-", 1)[0] for r in others}),
        # planning, the runner's start and Prefect's own bookkeeping
        "rest_s": round(wall - span - gate_span - reduce, 2),
    }


def project(result: dict[str, Any], users: int) -> list[dict[str, Any]]:
    """Wall time at 100x and 1,000x UserArena on N workers, from the Ray run: parts and buckets of the
    same size as measured (so as many more of them as there are more users, each taking the measured
    median, its work and its gate's checks), ceil(tasks / N) waves of them, the reduce growing linearly
    with the users (it is not spread), the rest as measured."""
    rows = []
    for scale in (100, 1000):
        target = USERARENA_USERS * scale
        for workers in (2, 16, 64, 256):
            row: dict[str, Any] = {"scale": scale, "users": target, "workers": workers}
            for stage in STAGES:
                measured = result.get(stage)
                if not measured or not measured["buckets"]:
                    continue
                tasks = math.ceil(measured["buckets"] * target / users)
                waves = math.ceil(tasks / workers)
                mapped = waves * (measured["bucket_median_s"] + measured["gate_bucket_median_s"])
                reduced = measured["reduce_s"] * target / users
                total = mapped + reduced + measured["rest_s"]
                row[f"{stage}_tasks"] = tasks
                row[f"{stage}_s"] = round(total)
                row[f"{stage}_reduce_share"] = round(reduced / total, 2)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--users", type=int, default=10 * USERARENA_USERS)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--ray-cpus", type=int, default=2, help="CPUs of the local Ray instance")
    parser.add_argument("--runners", default="local,ray")
    parser.add_argument("--stages", default=",".join(STAGES), help="of " + ", ".join(STAGES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/trajforge-scale"))
    args = parser.parse_args()

    import flows  # noqa: F401  (the ephemeral Prefect API's defaults)
    from flows.buckets import ScaleSettings, prefect_api_url, using_scale

    args.work.mkdir(parents=True, exist_ok=True)
    stages = args.stages.split(",")
    started = time.perf_counter()
    lake = build_lake(args.work, args.users, args.buckets, args.seed)
    out: dict[str, Any] = {
        "when": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": describe(),
        "users": args.users,
        "buckets": args.buckets,
        "lake_s": round(time.perf_counter() - started, 1),
        "runners": {},
    }
    api = prefect_api_url()  # the ephemeral API started before any timing
    for runner in args.runners.split(","):
        if runner == "ray":  # started before the timing too: a cluster is up before a run
            import ray

            env = {"env_vars": {"PREFECT_API_URL": api}}
            ray.init(num_cpus=args.ray_cpus, include_dashboard=False, runtime_env=env)
        settings = ScaleSettings(task_runner=runner, ray_workers=args.ray_cpus)  # type: ignore[arg-type]
        measured: dict[str, Any] = {}
        with using_scale(settings):
            for stage in stages:
                with RssSampler() as rss:
                    measured[stage] = run_stage(stage, lake, raw_bundle(args.work, args.users), args.buckets)
                measured[stage]["peak_rss_driver_gib"] = round(rss.driver / 2**30, 2)
                measured[stage]["peak_rss_worker_gib"] = round(rss.worker / 2**30, 2)
        for process in ("driver", "worker"):
            key = f"peak_rss_{process}_gib"
            measured[key] = max(measured[stage][key] for stage in stages)
        out["runners"][runner] = measured
        print(runner, json.dumps(measured), flush=True)
    if "ray" in out["runners"]:
        out["projection"] = project(out["runners"]["ray"], args.users)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

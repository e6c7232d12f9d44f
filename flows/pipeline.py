"""The end-to-end flow: raw logs -> lake -> histories -> records -> extraction, each stage gated.

Each stage is its own flow, run here as a subflow, so a deployment of this flow
shows the stages as one tree in the Prefect UI, and any stage can also be run
(or served) alone.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from extractors.config import ExtractSettings
from flows.caching import run_stage
from flows.stages import chain_stage, extract_stage, extraction_states_stage, ingest_stage, records_stage
from transforms.config import IngestSettings
from transforms.prompts import PromptSettings


@flow(name="pipeline")
def pipeline_flow(
    raw: str,
    lake: str,
    source_format: str = "bundle",
    settings: IngestSettings | None = None,
    force: bool = False,
    extract: ExtractSettings | None = None,
    records: PromptSettings | None = None,
) -> dict:
    """Ingest ``raw`` into ``lake``, chain sessions, render records, extract intents and rationales
    (offline backend unless ``extract`` says otherwise); returns each stage's summary and, under
    ``stages``, each stage's seconds and whether Prefect's cache served it (``force`` runs every
    stage again)."""
    logger = get_run_logger()
    ingested = run_stage(ingest_stage, lake, force, raw=raw, lake=lake, settings=settings,
                         source_format=source_format, reuse=not force)  # fmt: skip
    logger.info("ingest: %s steps", ingested.summary["output_rows"].get("steps"))
    chained = run_stage(chain_stage, lake, force, lake=lake, reuse=not force)
    # extraction reads the states as before any extraction, so its requests are the same on every run
    states = run_stage(extraction_states_stage, lake, force, lake=lake, settings=records, reuse=not force)
    extracted = run_stage(extract_stage, lake, force, lake=lake, settings=extract, reuse=not force)
    # the records' one writer: gold responses, intents, and each history window's rationales
    rendered = run_stage(records_stage, lake, force, lake=lake, settings=records, reuse=not force)
    outcomes = {"ingest": ingested, "chain": chained, "extraction states": states,
                "extract": extracted, "records": rendered}  # fmt: skip
    return {
        "ingest": ingested.summary,
        "chain": chained.summary,
        "extract": extracted.summary,
        "records": rendered.summary,
        "stages": {name: outcome.timing() for name, outcome in outcomes.items()},
    }

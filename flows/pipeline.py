"""The end-to-end flow: raw logs -> lake -> histories -> records -> extraction, each stage gated.

Each stage is its own flow, run here as a subflow, so a deployment of this flow
shows the stages as one tree in the Prefect UI, and any stage can also be run
(or served) alone.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from extractors.config import ExtractSettings
from flows.chain import chain_flow
from flows.extract import extract_flow
from flows.ingest import ingest_flow
from flows.records import records_flow
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
    (offline backend unless ``extract`` says otherwise); returns each stage's summary."""
    logger = get_run_logger()
    ingested = ingest_flow(raw, lake, settings=settings, force=force, source_format=source_format)
    logger.info("ingest: %s steps", ingested["output_rows"].get("steps"))
    chained = chain_flow(lake)
    records_flow(lake, settings=records)
    extracted = extract_flow(lake, settings=extract)
    # render again so each state's history window shows the rationales of the steps before it
    rendered = records_flow(lake, settings=records)
    return {"ingest": ingested, "chain": chained, "extract": extracted, "records": rendered}

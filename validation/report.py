"""What a gate run found: per-check outcomes, per-table accounting, the stop error,
and the files a run leaves behind (results JSON, summary JSON, a Data Docs listing).

Layout under the lake::

    LAKE/_runs/validation/<run_id>/summary.json   accounting + outcomes (small)
    LAKE/_runs/validation/<run_id>/results.json   GE validation results (long lists trimmed)
    LAKE/_docs/validation/<run_id>/index.html     GE Data Docs of the run
    LAKE/_docs/index.html                         every run, newest first
"""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transforms.files import atomic_file

RUNS_DIR = Path("_runs") / "validation"
DOCS_DIR = Path("_docs")
EXAMPLES = 5
LIST_LIMIT = 100  # entries kept per list in results.json; the quarantine keeps every row
VALUE_CHARS = 48


@dataclass
class CheckOutcome:
    """One check over one table, all batches combined."""

    suite: str
    table: str
    check: str
    expectation: str
    severity: str
    level: str
    doc: str
    success: bool
    evaluated: int = 0
    unexpected: int = 0
    observed: Any = None
    exception: str | None = None
    examples: list[dict[str, Any]] = field(default_factory=list)
    rows: list[int] = field(default_factory=list, repr=False)  # failing global row numbers

    @property
    def stops(self) -> bool:
        return self.exception is not None or (not self.success and self.severity == "error")

    @property
    def routes(self) -> bool:
        return not self.success and self.severity == "warn" and self.level == "row"

    @property
    def warns(self) -> bool:
        return not self.success and not self.stops

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("rows")
        return out


@dataclass
class TableReport:
    """Accounting of one table: rows_in = rows_out + quarantined."""

    table: str
    suite: str
    version: str
    rows_in: int = 0
    rows_out: int = 0
    quarantined: int = 0
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def balanced(self) -> bool:
        return self.rows_in == self.rows_out + self.quarantined


@dataclass
class GateSummary:
    run_id: str
    stage: str
    lake: str
    started_at: str
    seconds: float = 0.0
    tables: dict[str, TableReport] = field(default_factory=dict)
    outcomes: list[CheckOutcome] = field(default_factory=list)
    docs_index: str = ""
    results_path: str = ""

    @property
    def ok(self) -> bool:
        return not any(o.stops for o in self.outcomes)

    @property
    def failed(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.stops]

    @property
    def warned(self) -> list[CheckOutcome]:
        return [o for o in self.outcomes if o.warns]

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "stage": self.stage,
            "lake": self.lake,
            "started_at": self.started_at,
            "seconds": self.seconds,
            "ok": self.ok,
            "tables": {k: {**asdict(v), "balanced": v.balanced} for k, v in self.tables.items()},
            "outcomes": [o.to_dict() for o in self.outcomes if not o.success or o.exception],
            "checks_run": len(self.outcomes),
            "docs_index": self.docs_index,
            "results_path": self.results_path,
        }


# --- the stop message ---------------------------------------------------------


def _short(value: Any) -> str:
    text = (
        json.dumps(value, default=str, ensure_ascii=False) if isinstance(value, list | dict) else str(value)
    )
    text = " ".join(text.split())  # one paragraph: no newlines from the data
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _rows(n: int) -> str:
    return f"{n:,} row" if n == 1 else f"{n:,} rows"


def describe_row(example: dict[str, Any]) -> str:
    where = example.get("_at", "")
    values = ", ".join(f"{k}={_short(v)}" for k, v in example.items() if k != "_at")
    return f"{where} {{{values}}}".strip()


def describe_failure(o: CheckOutcome) -> str:
    if o.exception:
        return (
            f"table '{o.table}' could not evaluate expectation '{o.check}' ({o.expectation}): {o.exception}"
        )
    share = f"{o.unexpected:,} of {_rows(o.evaluated)}" if o.evaluated else "the table"
    text = f"table '{o.table}' failed expectation '{o.check}' ({o.doc}; {o.expectation}) on {share}"
    if o.examples:
        text += "; examples: " + "; ".join(describe_row(e) for e in o.examples[:EXAMPLES])
    elif o.observed is not None:
        text += f"; observed {_short(o.observed)}"
    return text


def error_paragraph(summary: GateSummary) -> str:
    failed = summary.failed
    first, rest = failed[0], failed[1:]
    text = (
        f"Validation gate after stage '{summary.stage}' stopped the run (run {summary.run_id}): "
        f"{describe_failure(first)}."
    )
    if rest:
        others = ", ".join(f"{o.table}.{o.check} ({_rows(o.unexpected)})" for o in rest[:8])
        more = f" and {len(rest) - 8} more" if len(rest) > 8 else ""
        text += f" {len(rest)} more error expectation(s) failed: {others}{more}."
    text += (
        " Nothing was rewritten or quarantined by the gate; the lake keeps its previous tables."
        f" Results: {summary.results_path}."
    )
    if summary.docs_index:
        text += f" Data Docs: {summary.docs_index}."
    return text


class GateError(Exception):
    """An error-severity expectation failed: the flow stops. ``str()`` is one readable paragraph."""

    def __init__(self, summary: GateSummary) -> None:
        self.summary = summary
        super().__init__(error_paragraph(summary))

    def __reduce__(self) -> tuple:  # pickles (Prefect may) rebuild from the summary, not the text
        return (type(self), (self.summary,))


# --- files --------------------------------------------------------------------


def _trim(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _trim(v) for k, v in value.items()}
    if isinstance(value, list) and len(value) > LIST_LIMIT:
        return [*(_trim(v) for v in value[:LIST_LIMIT]), f"... {len(value) - LIST_LIMIT} more"]
    if isinstance(value, list):
        return [_trim(v) for v in value]
    return value


def _write_json(path: Path, data: Any) -> None:
    with atomic_file(path) as temporary:
        temporary.write_text(json.dumps(data, indent=1, default=str, ensure_ascii=False))


def write_run_files(run_dir: Path, summary: GateSummary, results: list[dict[str, Any]]) -> None:
    _write_json(run_dir / "results.json", [_trim(r) for r in results])
    _write_json(run_dir / "summary.json", summary.to_dict())


def write_docs_listing(lake: Path) -> Path:
    """``LAKE/_docs/index.html``: one line per validation run, newest first."""
    rows = []
    for path in sorted((lake / RUNS_DIR).glob("*/summary.json"), reverse=True):
        s = json.loads(path.read_text())
        status = "ok" if s.get("ok") else "STOPPED"
        link = f"validation/{html.escape(s['run_id'])}/index.html"
        tables = html.escape(", ".join(s.get("tables", {})))
        rows.append(
            f"<tr><td><a href='{link}'>{html.escape(s['run_id'])}</a></td><td>{html.escape(s['stage'])}</td>"
            f"<td>{status}</td><td>{tables}</td></tr>"
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>trajforge validation runs</title></head>"
        "<body><h1>Validation runs</h1><table><tr><th>run</th><th>stage</th><th>status</th>"
        f"<th>tables</th></tr>{''.join(rows)}</table></body></html>"
    )
    out = lake / DOCS_DIR / "index.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return out

"""Clean stops: a bad input or a stage's refusal ends a command with one line on stderr and exit code 1;
any other error keeps its traceback, for it is a bug to report."""

from __future__ import annotations

import logging
import sys

import typer
from rich.markup import escape

from cli.console import errors

#: errors that stop a command cleanly (a ValueError is a bad value given, a missing file a path given)
STOPS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, NotADirectoryError,
                                          IsADirectoryError, PermissionError, FileExistsError)  # fmt: skip
#: the stage errors that stop cleanly too, by module: looked up only once their module is imported
STOPS_BY_MODULE = {
    "transforms.readers": "BundleError",
    "validation.report": "GateError",
    "flows.train": "StageNotAvailable",
    "trainer.pretrained": "ModelUnavailable",
}


def clean_stops() -> tuple[type[BaseException], ...]:
    """``STOPS`` and those of ``STOPS_BY_MODULE`` already imported (an error of a module never
    imported cannot have been raised)."""
    loaded = (getattr(sys.modules[m], name, None) for m, name in STOPS_BY_MODULE.items() if m in sys.modules)
    return STOPS + tuple(kind for kind in loaded if isinstance(kind, type))


def one_line(err: BaseException) -> str:
    """An error's message as one line (a pydantic error: each refused field with its reason)."""
    from pydantic import ValidationError

    from cli.settings import validation_line

    text = validation_line(err) if isinstance(err, ValidationError) else str(err)
    if isinstance(err, OSError) and err.filename is not None and err.strerror:
        text = f"{err.filename}: {err.strerror}"
    return " ".join(part.strip() for part in text.splitlines() if part.strip()) or type(err).__name__


def stopped(err: BaseException) -> typer.Exit:
    """Print a clean stop (a bad input, a gate, a bundle problem) as one line on stderr, no traceback."""
    errors.print(f"[red]stopped:[/red] {escape(one_line(err))}")
    return typer.Exit(1)


class QuietCleanStops(logging.Filter):
    """Prefect's run loggers print the traceback of a failed task or flow; for a clean stop the
    command prints its own line, so the record keeps its message and loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], clean_stops()):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_clean_stops() -> None:
    """Install ``QuietCleanStops`` on Prefect's flow- and task-run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietCleanStops) for f in logger.filters):
            logger.addFilter(QuietCleanStops())

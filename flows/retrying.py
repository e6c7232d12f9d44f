"""Prefect retries for what can fail once and then succeed: I/O and network calls.

A deterministic failure (a missing file, a refused permission, a bad value, a failed gate) fails
once: retrying it would only repeat the same error, later.
"""

from __future__ import annotations

from typing import Any

#: OSErrors that say something about the paths given, not about the moment
LASTING_OS_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
)


def transient(error: BaseException) -> bool:
    """Worth a retry: a connection or timeout (both OSErrors), a disk or network hiccup."""
    if isinstance(error, LASTING_OS_ERRORS):
        return False
    if isinstance(error, OSError):
        return True
    try:
        import httpx
    except ImportError:  # pragma: no cover - httpx comes with Prefect
        return False
    return isinstance(error, httpx.TransportError)


def retry_on_io(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed run only when its exception is ``transient``."""
    try:
        state.result()
    except BaseException as error:  # the state's own exception, judged here
        return transient(error)
    return False


#: the task options of a step that reads or writes files: one retry, and only for a transient error
IO_RETRIES: dict[str, Any] = {"retries": 1, "retry_delay_seconds": 2, "retry_condition_fn": retry_on_io}

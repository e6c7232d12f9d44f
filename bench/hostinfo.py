"""The machine a benchmark ran on, as one line for bench/RESULTS.md, and a process's own peak RSS."""

from __future__ import annotations

import os
import platform
import resource
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu_model()}), {ram:.0f} GiB RAM, Python {platform.python_version()}"


def peak_rss_kib() -> int:
    """This process's peak RSS: VmHWM (ru_maxrss would include the parent's, kept across exec on Linux)."""
    peak = _proc_status_kib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def rss_kib() -> int:
    """This process's RSS now (0 where /proc is not there)."""
    return _proc_status_kib("VmRSS") or 0


def _proc_status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None

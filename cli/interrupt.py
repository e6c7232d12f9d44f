"""Ctrl-C ends any ``trajforge`` command in seconds, with one line and exit code 130.

A terminal's Ctrl-C signals its whole foreground process group. Prefect starts its
temporary API server as a child in that group, so the server died with the command,
which then spent minutes retrying to report the interrupted run to it and ended in
connection tracebacks. Started in a session of its own, the server outlives the
interrupt, records the interrupted run as crashed, and is stopped at exit as usual.

A command killed outright (SIGKILL, the OOM killer) never stops the server, and in a
session of its own nothing else would: the server runs under a guard that watches the
command's process and ends the server once the command is gone.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, what shells report for a command ended by Ctrl-C

#: what an interrupted command leaves behind, by command name
KEPT_ON_INTERRUPT: dict[str, str] = {
    "extract": "every answer received so far is cached in the lake and is not asked for again",
    "run": "the stages that finished are in the lake; the stage cut short left its previous tables",
    "synth": "the raw bundle is written aside and moved into place only when complete",
    "serve": "the served deployments stay registered, their schedules paused until served again",
    "train": "the run's newest checkpoints stay in --out",
    "evaluate": "every session's finished trace stays in --out",
}
KEPT_BY_A_STAGE = "the lake keeps its previous tables: a stage swaps its tables in only when complete"
#: how a command cut short continues where running it again as it was would not (train refuses
#: an --out holding a run, unless told to continue it)
CONTINUED_BY: dict[str, str] = {
    "train": "run the same `trajforge train` command with --resume added to continue from the newest "
    "checkpoint (cut short before the first one: with --overwrite to start over)",
    "evaluate": "run the same `trajforge evaluate` command again to resume: the sessions already written "
    "are skipped, and the others draw what an uninterrupted run would have",
}


def interrupted_line(command: str | None) -> str:
    """The one line printed when Ctrl-C ends ``command``: what was kept and how to resume."""
    kept = KEPT_ON_INTERRUPT.get(command or "", KEPT_BY_A_STAGE)
    again = f"`trajforge {command}`" if command else "the command"
    continued = CONTINUED_BY.get(command or "", f"run {again} again with the same options to resume")
    return f"interrupted: {kept}; {continued}"


#: ``python -c GUARD PARENT_PID MODULE ARGS...``: runs ``python -m MODULE ARGS...`` in this process
#: while a thread checks twice a second that PARENT_PID is still its parent; once it is not (the
#: parent died and the process was handed to init), the process is sent SIGTERM, which uvicorn
#: answers by shutting down, and is ended outright 10 s later if it is still running
GUARD = """
import os, runpy, signal, sys, threading, time
parent = int(sys.argv[1])
def watch():
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
    os._exit(1)
threading.Thread(target=watch, name="parent-watch", daemon=True).start()
sys.argv = sys.argv[2:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


def guarded(args: list[str]) -> list[str]:
    """``[python, -m, MODULE, *rest]`` run under :data:`GUARD` with this process as the parent it
    watches; any other command as it is."""
    if len(args) >= 3 and args[1] == "-m":
        return [args[0], "-c", GUARD, str(os.getpid()), *args[2:]]
    return list(args)


class _SubprocessInOwnSession:
    """The ``subprocess`` module as Prefect's server module sees it: every Popen in a new session,
    a ``python -m`` server guarded so it ends with this process."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen:  # the name subprocess.Popen goes by
        if "args" in kwargs:
            kwargs["args"] = guarded(list(kwargs["args"]))
        elif args:
            args = (guarded(list(args[0])), *args[1:])
        return subprocess.Popen(*args, **{**kwargs, "start_new_session": True})


def keep_api_server_through_interrupts() -> None:
    """Start Prefect's temporary API server outside the terminal's process group (idempotent).

    Only the server module's view of ``subprocess`` changes; every other child process of the
    command still receives Ctrl-C as usual.
    """
    from prefect.server.api import server

    if not isinstance(server.subprocess, _SubprocessInOwnSession):
        server.subprocess = _SubprocessInOwnSession()


def say_which_server(console: Console) -> None:
    """One line naming the Prefect server the command's flows report to, when the user configured
    one (``PREFECT_API_URL`` in the environment or the active Prefect profile); without one Prefect
    starts a temporary server and says so itself."""
    from prefect.settings import PREFECT_API_URL, load_current_profile

    url = os.environ.get("PREFECT_API_URL") or load_current_profile().settings.get(PREFECT_API_URL)
    if url:
        console.print(f"flows report to the Prefect server at {url}", soft_wrap=True, highlight=False)


class InterruptibleGroup(TyperGroup):
    """The command group of the CLI: Ctrl-C during a command prints one line, exit code 130.

    Commands that run flows keep Prefect's API server alive through the interrupt, so the
    interrupted run is recorded at once instead of retried against a dead server.
    """

    console = Console(stderr=True)
    #: commands that never run a flow, so never start the API server (and skip importing it)
    WITHOUT_FLOWS = frozenset({"sql", "synth"})

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name not in self.WITHOUT_FLOWS:
            keep_api_server_through_interrupts()
            say_which_server(self.console)
        return name, command, rest

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            line = interrupted_line(ctx.invoked_subcommand)
            self.console.print(line, soft_wrap=True, markup=False, highlight=False)
            raise typer.Exit(INTERRUPTED_EXIT_CODE) from None

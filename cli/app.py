"""``trajforge``: the command line of the pipeline, its commands registered in the order ``--help``
lists them."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from cli import dataset, simulator
from cli.console import errors
from cli.interrupt import InterruptibleGroup
from cli.stops import clean_stops, quiet_clean_stops, stopped

USAGE_EXIT_CODE = 2  # click's, for a command line it cannot parse
#: what typer raises for a command line it cannot parse (its own click, whose module is not public)
UsageError = next(kind for kind in typer.BadParameter.__mro__ if kind.__name__ == "UsageError")


class CommandLine(InterruptibleGroup):
    """The command group: beside Ctrl-C's line, a usage error is one line (exit code 2) and a clean
    stop (a bad input, a stage's refusal) one line (exit code 1), never a traceback."""

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        resolved = super().resolve_command(ctx, args)
        quiet_clean_stops()  # after Prefect is imported: its logging setup comes first
        return resolved

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as err:
            command = (err.ctx or ctx).command_path
            # typer's coercion prefixes its reason with "Value error, "
            reason = " ".join(err.format_message().replace("Value error, ", "").split())
            errors.print(f"[red]error:[/red] {escape(reason)} (see {escape(command)} --help)")
            raise typer.Exit(USAGE_EXIT_CODE) from None
        except clean_stops() as err:
            raise stopped(err) from None


app = typer.Typer(
    cls=CommandLine,
    help="Build faithful shopper-simulator datasets from interaction logs.",
    no_args_is_help=True,
)


def print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        typer.echo(f"trajforge {version('trajforge')}")
        raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option("--version", callback=print_version, is_eager=True, help="print the version and exit"),
    ] = False,
) -> None:
    """Build faithful shopper-simulator datasets from interaction logs."""


COMMANDS = (
    dataset.synth,
    dataset.ingest,
    dataset.chain,
    dataset.records,
    dataset.extract,
    simulator.train,
    dataset.validate,
    dataset.sql,
    simulator.run,
    simulator.score,
    simulator.evaluate,
    simulator.abtest,
    dataset.serve,
)
for command in COMMANDS:
    app.command()(command)


if __name__ == "__main__":
    app()

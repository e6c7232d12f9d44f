"""``python -m cli``: the ``trajforge`` command (what ``torchrun -m cli`` starts on each rank)."""

from cli.app import app

app()

"""``schemas.BORN_IN`` names, for every column of every lake table, a function that exists."""

from __future__ import annotations

import importlib

from transforms.schemas import BORN_IN, LAKE_TABLES


def _function(name: str) -> object:
    """``align.build_steps`` -> transforms.align.build_steps; ``extractors.x.f`` -> extractors.x.f."""
    module, _, attribute = name.rpartition(".")
    package = module if module.startswith("extractors") else f"transforms.{module}"
    return getattr(importlib.import_module(package), attribute)


def test_every_lake_column_has_a_birth():
    assert set(BORN_IN) == set(LAKE_TABLES)
    for table, schema in LAKE_TABLES.items():
        assert set(BORN_IN[table]) == set(schema.names), table


def test_every_named_function_exists():
    named = {note.split(" ")[0] for columns in BORN_IN.values() for note in columns.values()}
    named.discard("as")  # "as logged": the raw field itself
    for name in sorted(named):
        assert callable(_function(name)), name

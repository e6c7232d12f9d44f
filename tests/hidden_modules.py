"""Python source that hides installed packages from an interpreter, as on a machine without them.

The path finder is replaced by one that finds nothing for the hidden top-level names, so ``import``
fails and ``importlib.util.find_spec`` says None (None entries in ``sys.modules`` would instead make
find_spec's callers, pyarrow's pandas probe among them, trip over a None module). The source defines
``ABSENT``, the hidden names, for code that runs after it.
"""

from __future__ import annotations

from collections.abc import Sequence


def hiding(absent: Sequence[str]) -> str:
    """Source to run first in an interpreter (``-c`` or a sitecustomize) so that ``absent`` are gone."""
    return f"""
import sys
from importlib.machinery import PathFinder
ABSENT = {tuple(absent)!r}

class Absent(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in ABSENT else super().find_spec(name, path, target)

sys.meta_path[:] = [Absent if finder is PathFinder else finder for finder in sys.meta_path]
"""

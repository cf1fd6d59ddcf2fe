"""matplotlib for the pictures ``hotset compare`` and ``hotset simulate`` draw. It is an
extra (``pip install 'hotset[plot]'``): without it their tables and JSON are written and
the picture is left out, with a line that says how to get it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType


def pyplot(path: str | Path) -> ModuleType | None:
    """``matplotlib.pyplot`` (drawing to files, no display), or None (and a line on
    stderr naming the picture ``path`` left out) where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        print(f"{path} not drawn: matplotlib is missing (pip install 'hotset[plot]')",
              file=sys.stderr)  # fmt: skip
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def written(out: Path, name: str) -> str:
    """``out/NAME.json``, and ``out/NAME.png`` where it was drawn: what a command wrote."""
    png = out / f"{name}.png"
    return f"{out / name}.json" + (f" and {png}" if png.exists() else "")

"""Shared output of the benchmarks: a JSON file and a human table."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def report(
    name: str, rows: list[dict], columns: list[tuple[str, str]], meta: dict | None = None
) -> None:
    """Print ``rows`` as a table of ``columns`` (key, format) and write results/NAME.json."""
    RESULTS.mkdir(exist_ok=True)
    doc = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "python": platform.python_version(),
            "cpu": platform.processor(),
            "cores": __import__("os").cpu_count(),
        },
        **(meta or {}),
        "rows": rows,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(doc, indent=2))
    widths = [max(len(k), *(len(format(r[k], f)) for r in rows)) for k, f in columns]
    print(" ".join(k.rjust(w) for (k, _), w in zip(columns, widths, strict=True)))
    for r in rows:
        print(" ".join(format(r[k], f).rjust(w) for (k, f), w in zip(columns, widths, strict=True)))
    print(f"wrote {RESULTS / (name + '.json')}")

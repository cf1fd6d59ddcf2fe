"""The runtime lock: the packages ``pip install 'hotset[plot]'`` needs (the demo draws its
picture), at the versions of the tested lock (``requirements.lock``), found by walking the
installed package's requirements. ``make demo`` installs it alone; ``make lock`` writes it.

    python scripts/runtime_lock.py > requirements-runtime.lock
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement

HEADER = """\
# The runtime set: what `make demo` installs (hotset and its [plot] extra), at the versions
# of requirements.lock; torch is installed apart. Regenerate with `make lock`.
"""


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str, extras: tuple[str, ...] = ()) -> dict[str, str]:
    """Every distribution ``root`` (with its ``extras``) needs, by name: markers
    evaluated here, no extras of the others."""
    seen: dict[str, str] = {}
    todo = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # a marker-excluded or optional dependency not installed here
        key = _key(dist.metadata["Name"])
        if key in seen:
            continue
        seen[key] = f"{dist.metadata['Name']}=={dist.version}"
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(
                req.marker.evaluate({"extra": e}) for e in ("", *wanted)
            ):
                todo.append((req.name, ()))
    return seen


def main() -> None:
    pins = closure("hotset", ("plot",))
    # hotset itself, torch (installed apart: its CPU build), and what `pip freeze` leaves
    # out of requirements.lock
    for name in ("hotset", "torch", "pip", "setuptools", "wheel"):
        pins.pop(name, None)
    print(HEADER + "\n".join(sorted(pins.values(), key=str.lower)))


if __name__ == "__main__":
    main()

"""Build the API reference from the docstrings (pdoc) into ``site/`` (``make docs``).

Every module of the package is documented; a warning (an annotation that does not
resolve, a module that does not import) fails the build, as in CI."""

from __future__ import annotations

import pkgutil
import sys
import warnings
from pathlib import Path

import pdoc

import hotset

#: pdoc cannot resolve the string annotations of a NamedTuple's generated ``__new__``
KNOWN = ("Batch.__init__",)


def modules() -> list[str]:
    """The package and its direct children (pdoc documents a subpackage's modules)."""
    return ["hotset", *sorted(m.name for m in pkgutil.iter_modules(hotset.__path__, "hotset."))]


def main(out: str = "site") -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules(), output_directory=Path(out))
    problems = sorted({str(w.message) for w in caught if "pdoc" in w.filename
                       and not any(k in str(w.message) for k in KNOWN)})  # fmt: skip
    if problems:
        sys.exit("API reference: " + "\n".join(problems))
    print(f"API reference: {len(modules())} modules in {out}/")


if __name__ == "__main__":
    main(*sys.argv[1:])

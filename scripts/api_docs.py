"""Build the API reference from the docstrings (pdoc) into ``site/`` (``make docs``).

Every module of the package is documented; a warning (an annotation that does not
resolve, a module that does not import) or a broken reference (a link of the reference to
a page or anchor it lacks; a relative link of README.md or docs/ to a missing file) fails
the build, as in CI."""

from __future__ import annotations

import pkgutil
import re
import sys
import warnings
from html.parser import HTMLParser
from pathlib import Path

import pdoc

import hotset

#: pdoc cannot resolve the string annotations of a NamedTuple's generated ``__new__``
KNOWN = ("Batch.__init__",)


def modules() -> list[str]:
    """The package and its direct children (pdoc documents a subpackage's modules)."""
    return ["hotset", *sorted(m.name for m in pkgutil.iter_modules(hotset.__path__, "hotset."))]


class Links(HTMLParser):
    """The ``href`` targets and the ``id`` anchors of one HTML page."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs) -> None:
        a = dict(attrs)
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])
        if a.get("id"):
            self.ids.add(a["id"])


def inherited(anchor: str, page: Links) -> bool:
    """pdoc links ``Cls.member`` in a docstring to ``#Cls.member`` where ``member`` is
    inherited, and documents it under the base's anchor: listed there, it resolves."""
    member = "." + anchor.rpartition(".")[2]
    return "." in anchor and any(
        h.rpartition("#")[2].endswith(member) and h != "#" + anchor for h in page.hrefs
    )


def broken_links(out: Path) -> list[str]:
    """Links between the reference's pages to a page or an anchor that is not there."""
    pages = {}
    for page in out.rglob("*.html"):
        pages[page.resolve()] = parsed = Links()
        parsed.feed(page.read_text())
    broken = []
    for page, parsed in pages.items():
        for href in parsed.hrefs:
            if re.match(r"[a-z]+:", href) or "#_" in href:
                continue  # http(s), mailto: outside the reference; a private base's name
            target, _, anchor = href.partition("#")
            dest = (page.parent / target).resolve() if target else page
            if dest not in pages or (anchor and anchor not in pages[dest].ids
                                     and not inherited(anchor, pages[dest])):  # fmt: skip
                broken.append(f"{page.relative_to(out.resolve())}: {href}")
    return broken


def broken_doc_links(root: Path) -> list[str]:
    """Relative links of README.md and docs/*.md to files that do not exist."""
    broken = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if not re.match(r"[a-z]+:", target) and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(root)}: {target}")
    return broken


def main(out: str = "site") -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*modules(), output_directory=Path(out))
    problems = sorted({str(w.message) for w in caught if "pdoc" in w.filename
                       and not any(k in str(w.message) for k in KNOWN)})  # fmt: skip
    problems += broken_links(Path(out))
    problems += broken_doc_links(Path(__file__).resolve().parents[1])
    if problems:
        sys.exit("API reference: " + "\n".join(problems))
    print(f"API reference: {len(modules())} modules in {out}/")


if __name__ == "__main__":
    main(*sys.argv[1:])

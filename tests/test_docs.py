"""The docs a user reads: links that land, no history (no commit hashes; issue numbers
and dates only in the benchmarks' "Measured on" statements and the CHANGELOG's release
headings), a benchmarks page short enough to read, and every command-line option with
its help and default."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hotset.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CHANGELOG.md"]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
ISSUE = re.compile(r"\bissues? ?#?\d+|(?<![\w&])#\d+\b", re.IGNORECASE)
RELEASE = re.compile(r"## \d+\.\d+\.\d+ - 20\d\d-\d\d-\d\d$")
LINK = re.compile(r"\]\(([\w./-]*\.md)?#([\w-]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _history(path: Path) -> list[str]:
    """Lines that carry history: a commit hash anywhere, a date or an issue outside a
    "Measured on" statement (which runs to the end of its sentence) or a release's
    heading (``## 0.2.0 - 2026-12-06``)."""
    found, measured = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        measured = measured or "Measured on" in line
        release = RELEASE.match(line) is not None
        for pattern in (HASH,) if measured or release else (DATE, HASH, ISSUE):
            if m := pattern.search(line):
                found.append(f"{path.name}:{n}: {m.group(0)!r} in {line.strip()[:80]}")
        if measured and line.rstrip().endswith((".", ":", ")")):
            measured = False
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_hold_no_history(path):
    assert _history(path) == []


def test_the_history_check_finds_history(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Fixed in issue 12 (commit 1fe1972, 2026-12-05).\n"
                   "Measured on: 2026-12-05, 2 cores, commit 1fe1972.\n"
                   "## 0.2.0 - 2026-12-05\n")  # fmt: skip
    found = _history(doc)
    assert len(found) == 4 and [f.split(":")[1] for f in found] == ["1", "1", "1", "2"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_to_sections_land(path):
    for target, anchor in LINK.findall(path.read_text()):
        page = (path.parent / target) if target else path
        headings = [line.lstrip("#") for line in page.read_text().splitlines()
                    if line.startswith("#")]  # fmt: skip
        assert anchor in {_slug(h) for h in headings}, f"{path.name}: {target}#{anchor}"


def test_the_benchmarks_page_is_a_reference():
    assert len((ROOT / "docs" / "benchmarks.md").read_text().splitlines()) <= 400


def _options(parser: argparse.ArgumentParser, name: str = "hotset"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, subparser in action.choices.items():
                yield from _options(subparser, f"{name} {sub}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield name, action


def test_every_command_line_option_says_what_it_is_and_its_default():
    for name, action in _options(build_parser()):
        label = f"{name} {'/'.join(action.option_strings) or action.dest}"
        assert action.help, f"{label}: no help"
        if action.default not in (None, False, [], argparse.SUPPRESS):
            assert "default" in action.help.lower(), f"{label}: its default is not said"

"""Formats by name, as policies and samplers are: the module of ``storage/`` that reads a
format registers it (``register_format``), so a new format is one new file there
(docs/extending.md). ``make_loader(format=NAME)`` opens it; without ``format=`` the
registry detects it from what the path holds."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hotset.errors import ConfigError
from hotset.registry import Registry, import_submodules

#: what a directory that no format claims is read as (one file per sample)
FALLBACK = "imagefolder"


@dataclass(frozen=True)
class Format:
    """A format: ``opens(url_or_urls, **options)`` makes its storage (``options``: those
    of ``open_storage``, ``storage_options`` among them). Detection: a path ending in
    ``suffix`` (a file, or a glob of them), or a directory holding such files, or one
    holding every name of ``marker`` (markers are tried first). ``indexes_whole``: it
    takes ``keep=`` / ``wants=`` (it reads whole objects to index them: the node's disk
    tier keeps those bytes)."""

    name: str
    opens: Callable[..., Any]
    suffix: str = ""
    marker: frozenset[str] = field(default_factory=frozenset)
    indexes_whole: bool = False


FORMATS: Registry = Registry("format")


def register_format(fmt: Format) -> Format:
    """Make ``fmt`` available by its name (``make_loader(format=...)``) and to detection."""
    return FORMATS.register(fmt)


def formats() -> Registry:
    """Every format, each storage module imported (so each has registered its own)."""
    _import_storage_modules()
    return FORMATS


@functools.cache
def _import_storage_modules() -> None:
    import_submodules(__name__.rpartition(".")[0], [os.path.dirname(__file__)])


def by_suffix(name: str) -> str | None:
    """The format a path ending so names (``shards/{0..9}.tar``: ``tar``), or None."""
    name = name.rstrip("/").lower()
    for fmt in formats().values():
        if fmt.suffix and (name.endswith(fmt.suffix) or name.endswith(fmt.suffix + "}")):
            return fmt.name
    return None


def in_directory(names: Iterable[str]) -> str:
    """The format of a directory holding ``names``: a marker's, else the one whose files
    it holds (a directory of two formats' files must name one), else ``FALLBACK``."""
    names = set(names)
    known = formats().values()
    for fmt in known:
        if fmt.marker and fmt.marker <= names:
            return fmt.name
    held = sorted(f.name for f in known if f.suffix and any(n.endswith(f.suffix) for n in names))
    if len(held) > 1:
        raise ConfigError(f"the directory holds files of the formats {held}: name one, format=")
    return held[0] if held else FALLBACK

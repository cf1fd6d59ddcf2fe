"""docs/systems.md states each importance system's defaults; this keeps it true."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from hotset.policy import make_policy
from hotset.sampling import make_sampler
from hotset.sampling.base import sampler_class
from hotset.systems import resolve_system

DOC = Path(__file__).resolve().parents[1] / "docs" / "systems.md"
SECTION = re.compile(r'^## .*`system="(\w+)"`', re.M)
CLAIM = re.compile(r"`((?:sampler|policy)(?:\.\w+)+) == ([^`]+)`")


def _claims() -> list[tuple[str, str, str]]:
    text = DOC.read_text()
    heads = list(SECTION.finditer(text))
    out = []
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        body = text[head.end() : nxt.start() if nxt else len(text)]
        out += [(head.group(1), path, value) for path, value in CLAIM.findall(body)]
    return out


def _build(name: str):
    system = resolve_system(name)
    n = 1000
    options = dict(system.sampler_options)
    if sampler_class(system.sampler).needs_labels:
        options["labels"] = np.arange(n) % 10
    sampler = make_sampler(system.sampler, n, **options)
    policy = make_policy(system.policy, 200, sizes=np.ones(n, np.int64))
    return {"sampler": sampler, "policy": policy}


CLAIMS = _claims()


def test_the_page_states_defaults_for_each_importance_system():
    assert {s for s, _, _ in CLAIMS} == {"shade", "icache", "spider"}
    assert len(CLAIMS) >= 20


@pytest.mark.parametrize(("system", "path", "value"), CLAIMS)
def test_each_stated_default_is_what_the_system_builds(system, path, value):
    parts = _build(system)
    root, *attrs = path.split(".")
    got = parts[root]
    for a in attrs:
        got = getattr(got, a)
    assert got == ast.literal_eval(value), f"{system}: {path} is {got!r}, docs say {value}"

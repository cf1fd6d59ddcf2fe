"""docs/systems.md states each importance system's defaults; this keeps it true, for the
system as a user builds it (``make_loader``) and as ``hotset compare`` measures it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

from hotset import make_loader

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


PATHS = ("make_loader", "compare")


@pytest.fixture(scope="module")
def built(fmnist_dir):
    """Each importance system built through both public paths: a user's
    ``make_loader(system=...)`` and ``hotset compare``'s arguments for it
    (``system_arguments``), over the same data, cache and run length."""
    from hotset.compare import CompareConfig, system_arguments

    loaders = {}
    common = dict(cache_fraction=0.2, store="memory", num_workers=0)
    for name in ("shade", "icache", "spider", "shade+", "icache+", "spider+"):
        cfg = CompareConfig(data=str(fmnist_dir), policies=[name], cache_fractions=[0.2], epochs=3)
        args = {
            "make_loader": dict(system=name, epochs=cfg.epochs, batch_size=cfg.batch_size,
                                seed=cfg.seed),
            "compare": system_arguments(cfg, name),
        }  # fmt: skip
        for path, kwargs in args.items():
            loaders[name, path] = make_loader(str(fmnist_dir / "train"), **common, **kwargs)
    yield loaders
    for loader in loaders.values():
        loader.close()


CLAIMS = _claims()


def test_the_page_states_defaults_for_each_importance_system():
    assert {s for s, _, _ in CLAIMS} == {"shade", "icache", "spider"}
    assert len(CLAIMS) >= 20


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("system", "path_", "value"), CLAIMS)
def test_each_stated_default_is_what_the_system_builds(built, system, path_, value, path):
    loader = built[system, path]
    got = {"sampler": loader.planner.sampler, "policy": loader.planner.policy}
    root, *attrs = path_.split(".")
    got = got[root]
    for a in attrs:
        got = getattr(got, a)
    want = ast.literal_eval(value)
    assert got == want, f"{system} ({path}): {path_} is {got!r}, docs say {value}"


@pytest.mark.parametrize("system", ["shade", "icache", "spider", "shade+", "icache+", "spider+"])
def test_compare_builds_exactly_what_a_user_builds(built, system):
    """Every option (the plan's fingerprint: sampler, policy and their options) and every
    field of the sampler's and the policy's state are the same both ways."""
    user, compare = built[system, "make_loader"], built[system, "compare"]
    assert user.fits == compare.fits
    for part in ("sampler", "policy"):
        a = getattr(user.planner, part).state_dict()
        b = getattr(compare.planner, part).state_dict()
        assert _same(a, b), f"{system}: the {part}s differ"


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        nan = a.dtype.kind in "fc"  # (unscored samples are NaN on both sides)
        return isinstance(b, np.ndarray) and np.array_equal(a, b, equal_nan=nan)
    if isinstance(a, np.random.Generator):
        return isinstance(b, np.random.Generator) and _same(
            a.bit_generator.state, b.bit_generator.state
        )
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and _same(vars(a), vars(b))
    return a == b or (a != a and b != b)

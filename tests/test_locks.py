"""The two locks agree: what ``make demo`` installs (``requirements-runtime.lock``) is the
runtime part of the tested set (``requirements.lock``), at the same versions, and covers
every runtime dependency pyproject.toml names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_the_runtime_lock_is_the_tested_locks_runtime_part():
    runtime, tested = _pins(ROOT / "requirements-runtime.lock"), _pins(ROOT / "requirements.lock")
    assert {k: v for k, v in runtime.items() if tested.get(k) != v} == {}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in project["dependencies"]}
    assert needed - {"torch"} <= set(runtime), needed - set(runtime)
    # the dev tools stay out of the demo's install
    assert not {"pytest", "moto", "hnswlib", "datasets", "lightning"} & set(runtime)


def test_the_extras_pins_are_the_tested_versions():
    """Every pinned extra (``[s3]``'s s3fs, aiobotocore and boto3, ``[plot]``, ...) admits
    the version the tested lock holds, which ``make install`` checks with ``pip check``
    beside moto[server]: the pins resolve together."""
    from packaging.requirements import Requirement

    tested = _pins(ROOT / "requirements.lock")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for extra, reqs in extras["optional-dependencies"].items():
        for text in reqs:
            req = Requirement(text)
            name = re.sub(r"[-_.]+", "-", req.name).lower()
            assert name in tested, (extra, name)
            assert req.specifier.contains(tested[name], prereleases=True), (extra, text)
    assert "moto" in tested and "pytest-xdist" in tested

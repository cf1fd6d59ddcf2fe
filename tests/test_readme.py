"""The README's Python examples run as written: each ```python block is executed with
the names it leaves to the reader (``storage``, ``model``, ``opt``, ``epochs``) bound to a
small prepared dataset, the tiny CNN and one epoch."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from hotset.models import TinyCNN
from hotset.storage import FileStorage

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run(fmnist_dir, capsys):
    blocks = python_blocks()
    assert blocks, "the README has no Python example"
    for code in blocks:
        model = TinyCNN()
        scope = {"storage": str(fmnist_dir / "train"), "model": model, "epochs": 1,
                 "opt": torch.optim.SGD(model.parameters(), lr=0.05)}  # fmt: skip
        exec(compile(code, str(README), "exec"), scope)  # noqa: S102 - our own README
        loader = scope["loader"]
        assert loader.counters()["accesses"] == len(FileStorage(scope["storage"]))  # an epoch
    assert "'hits'" in capsys.readouterr().out  # the counters printed

"""`hotset compare` on a user's data and model: RGB images of any size, the user's own
model as ``module:callable``, nothing resized unasked."""

from __future__ import annotations

import json

import pytest

from conftest import make_imagefolder
from hotset.cli import main

USER_MODEL = '''
import torch
from torch import nn

SEEN = []


def make(num_classes, in_channels):
    SEEN.append(in_channels)
    return nn.Sequential(nn.Conv2d(in_channels, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(4, num_classes))
'''


def _prepared(tmp_path, **kw):
    src = make_imagefolder(tmp_path / "src", per_class=12, **kw)
    assert main(["prepare", "imagefolder", str(src), str(tmp_path / "data")]) == 0
    return str(tmp_path / "data")


def _compare(tmp_path, data, *extra):
    return main(["compare", "--data", data, "--systems", "lru", "--cache-fractions", "0.2",
                 "--epochs", "1", "--num-workers", "0", "--store", "memory", "--batch-size",
                 "8", "--no-progress", "--out", str(tmp_path / "out"), "--json",
                 str(tmp_path / "rows.json"), "--device", "cpu", *extra])  # fmt: skip


def test_compare_trains_the_users_model_on_rgb_images_at_their_own_size(
    tmp_path, monkeypatch
):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "user_model.py").write_text(USER_MODEL)
    monkeypatch.syspath_prepend(str(tmp_path / "mine"))
    data = _prepared(tmp_path, side=64)
    assert _compare(tmp_path, data, "--model", "user_model:make") == 0
    import user_model

    assert user_model.SEEN and set(user_model.SEEN) == {3}  # the images' channels
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert [r["model"] for r in rows] == ["user_model:make"]
    assert rows[0]["test_accuracy"] is not None


def test_images_of_several_sizes_need_size_and_train_with_it(tmp_path, capsys):
    data = _prepared(tmp_path)  # 8 to 19 pixels a side
    assert _compare(tmp_path, data) == 2
    assert "--size W,H" in capsys.readouterr().err
    assert _compare(tmp_path, data, "--size", "16,16") == 0


@pytest.mark.parametrize("model, says", [
    ("nosuchmodule:make", "cannot import it"),
    ("json:nothing", "cannot import it"),
    ("json:__doc__", "not callable"),
    ("resnet", "module:callable"),
])  # fmt: skip
def test_a_model_that_cannot_be_made_is_named(tmp_path, capsys, model, says):
    data = _prepared(tmp_path, side=16)
    assert _compare(tmp_path, data, "--model", model) == 2
    err = capsys.readouterr().err
    assert model in err and says in err

#!/usr/bin/env bash
# The package as a user installs it: build the wheel, install it into a fresh venv outside
# the repository, and train one epoch through make_loader with it. Run by `make test`.
# The venv finds its dependencies (torch among them) in the project's venv, behind its own
# site-packages: a second torch install (several GB from PyPI, CUDA libraries included)
# does not fit on CI's disk. pip still checks the wheel's requirements against them.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$repo/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$repo"
"$python" -m venv "$work/venv"
deps="$("$repo/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
site="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
echo "$deps" > "$site/zz-project-deps.pth"  # a path line: the project's own .pth files stay unread
"$work/venv/bin/python" -m pip uninstall -q -y setuptools 2>/dev/null || true  # venv's old copy
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index \
  "$work"/dist/hotset-*.whl
cd "$work"  # not the repository: the installed package, not src/
"$work/venv/bin/hotset" --version
"$work/venv/bin/python" - <<'PY'
import torch
from torch.utils.data import TensorDataset

import hotset

assert "site-packages" in hotset.__file__, hotset.__file__
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 1, 8, 8, generator=g)
y = (x.mean(dim=(1, 2, 3)) > 0).long()
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with hotset.make_loader(hotset.from_dataset(TensorDataset(x, y)), batch_size=64,
                        system="shade", cache_fraction=0.2, num_workers=2) as loader:
    loader.set_epoch(0)
    served = 0
    for xb, yb, ids in loader:
        losses = hotset.per_sample_loss(model(xb), yb)
        opt.zero_grad()
        losses.mean().backward()
        opt.step()
        loader.feedback(ids, losses)
        served += len(ids)
    c = loader.counters()
assert served == 512, served
print(f"wheel smoke: one epoch of {served} samples, {c['misses']} read, hotset {hotset.__version__}")
PY

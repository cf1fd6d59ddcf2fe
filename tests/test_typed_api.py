"""A user's script type-checks against hotset's public API: ``mypy --strict`` and
``pyright`` in strict mode see every name ``import hotset`` exports, and the loader's
methods a training loop calls are typed (no ``Unknown`` reaches the user's code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import hotset

SCRIPT = Path(__file__).parent / "typed" / "user_script.py"


def test_the_names_written_out_for_type_checkers_are_the_exported_ones():
    assert sorted(hotset.__all__) == sorted(hotset._MODULE_OF)
    assert all(getattr(hotset, name) is not None for name in hotset.__all__)


def test_mypy_strict_accepts_a_users_script():
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          str(SCRIPT)], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_pyright_strict_accepts_a_users_script(tmp_path):
    config = tmp_path / "pyrightconfig.json"
    config.write_text(json.dumps({"typeCheckingMode": "strict", "pythonVersion": "3.11"}))
    command = [sys.executable, "-m", "pyright", "--pythonpath", sys.executable, "-p",
               str(config), str(SCRIPT)]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 errors" in out.stdout

"""ruff (E, F, I, UP, B; see pyproject.toml) is clean on the package, examples, benchmarks and
the docs hook."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (it is in the `test` extra)")
    proc = subprocess.run([exe, "check", "--output-format", "concise", "spmdtyped", "examples",
                           "benchmarks", "docs/hooks.py"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr

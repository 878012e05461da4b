"""First contact: `python -m spmdtyped --version`, hints for missing optional tools, metadata."""

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import spmdtyped
from spmdtyped import __main__ as cli

ROOT = Path(__file__).resolve().parents[1]


def test_version_flag():
    proc = subprocess.run([sys.executable, "-m", "spmdtyped", "--version"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == f"spmdtyped {spmdtyped.__version__}"


def test_missing_tool_names_the_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("libcst", "mypy") else real(name, *a))
    assert cli.main(["port", "x.py"]) == 2
    assert "pip install 'spmdtyped[port]'" in capsys.readouterr().err
    assert cli.main(["check", "x.py"]) == 2
    assert "pip install 'spmdtyped[mypy]'" in capsys.readouterr().err


def test_metadata_has_spdx_license_urls_and_extras():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert project["urls"]["Documentation"].startswith("https://")
    extras = project["optional-dependencies"]
    assert any(d.startswith("libcst") for d in extras["port"])
    names = {d.split("==")[0] for d in extras["ecosystem"]}
    assert names == {"equinox", "optax", "flax", "orbax-checkpoint"}
    assert "ecosystem" in (ROOT / "Makefile").read_text()

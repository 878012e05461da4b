"""Every code block of docs/pyright.md runs: the command writes the stub, the config blocks are
the configs the checkers get, and the Python block passes pyright and plain mypy with errors
exactly on its `# error` lines."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import pyright_or_skip

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "pyright.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```\s*$", re.M | re.S)


def blocks() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for lang, body in BLOCK.findall(PAGE.read_text()):
        out.setdefault(lang, []).append(body)
    return out


def test_the_page_has_the_blocks_this_test_runs() -> None:
    assert {k: len(v) for k, v in blocks().items()} == {"bash": 1, "json": 1, "ini": 1, "python": 1}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user project built from the page: the command, the two configs, the module."""
    tmp = tmp_path_factory.mktemp("pyright_page")
    b = blocks()
    (cmd,) = b["bash"]
    argv = shlex.split(cmd.strip())
    assert argv[:3] == ["python", "-m", "spmdtyped"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(b["json"][0])
    config["pythonVersion"] = "3.11"
    (tmp / "pyrightconfig.json").write_text(json.dumps(config))
    (tmp / "mypy.ini").write_text(b["ini"][0])
    (tmp / "module.py").write_text(b["python"][0])
    return tmp


def _error_lines() -> set[int]:
    return {n for n, line in enumerate(blocks()["python"][0].splitlines(), 1) if "# error" in line}


def test_python_block_under_pyright(project: Path) -> None:
    exe = pyright_or_skip()
    proc = subprocess.run([exe, "--outputjson", "--pythonpath", sys.executable, "module.py"],
                          cwd=project, capture_output=True, text=True, timeout=600)
    diags = json.loads(proc.stdout)["generalDiagnostics"]
    errors = {d["range"]["start"]["line"] + 1 for d in diags if d["severity"] == "error"}
    assert errors == _error_lines(), diags
    codes = {d["range"]["start"]["line"] + 1: d["message"] for d in diags if d["severity"] == "error"}
    for n, line in enumerate(blocks()["python"][0].splitlines(), 1):
        if "# error: " in line:
            code = line.split("# error: ")[1].split()[0]
            assert code in codes[n], (n, codes[n])


def test_python_block_under_plain_mypy(project: Path) -> None:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini",
                           "--cache-dir", str(project / ".mypy_cache"), "module.py"],
                          cwd=project, env=env, capture_output=True, text=True, timeout=600)
    errors = {int(m.group(1)) for m in re.finditer(r"^module\.py:(\d+): error", proc.stdout, re.M)}
    assert errors == _error_lines(), proc.stdout

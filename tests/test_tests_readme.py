"""The suite's own map and its parallel setup: tests/README.md names every test file, helper
and data folder, and every file it names exists; the modules `conftest.GROUPED_MODULES` keeps
on one xdist worker exist; `make test` runs the workers with that grouping.
"""

from __future__ import annotations

import re
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
README = (TESTS / "README.md").read_text()
NAMED = re.compile(r"`((?:test_|_|conftest)[\w]*\.py|[a-z_]+/)(?:::\w+)?`")


def test_the_map_names_every_test_file_helper_and_folder() -> None:
    named = set(NAMED.findall(README))
    files = {p.name for p in TESTS.glob("*.py")}
    folders = {f"{p.name}/" for p in TESTS.iterdir()
               if p.is_dir() and not p.name.startswith((".", "_")) and any(p.glob("*.py"))}
    missing = sorted((files | folders) - named)
    assert not missing, f"tests/README.md does not say what these are for: {missing}"


def test_every_file_the_map_names_exists() -> None:
    """A name is a file or folder of tests/, of the package (`_typed/`, `_surface.py`) or of
    the repository root (`docs/`)."""
    package = ROOT / "spmdtyped"
    for name in NAMED.findall(README):
        assert any((base / name).exists() for base in (TESTS, package, ROOT)), (
            f"tests/README.md names {name}, which does not exist")
    for path in re.findall(r"`(_\w+/[\w/]+\.py)`", README):
        assert (package / path).exists(), f"tests/README.md names spmdtyped/{path}"
    for node in re.findall(r"`(test_\w+\.py)::(\w+)`", README):
        assert f"def {node[1]}(" in (TESTS / node[0]).read_text(), node


def test_grouped_modules_exist_and_make_test_groups() -> None:
    for module in conftest.GROUPED_MODULES:
        assert (TESTS / f"{module}.py").exists(), f"conftest.GROUPED_MODULES: no {module}.py"
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "-n $(JOBS) --dist loadgroup" in test_recipe and "--durations=" in test_recipe

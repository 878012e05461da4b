"""The plugin on real code: `examples/*.py` and their broken twins `examples/broken/*_broken.py`.

- A working example has no error at all under mypy with the plugin (not only no `spmd-*`
  error: no false positives on real programs, and the examples are typed code).
- Every broken twin is rejected statically: its first `spmd-*` error is on the line marked
  `# expect: SPMD###`, with that code's mypy spelling (the runtime raises the same code from the
  same line, `tests/test_examples.py`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_typing import CACHE, REPO, mypy_config, mypy_errors, run_mypy

from spmdtyped._errors import REGISTRY

EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.py") if not p.name.startswith("_"))
BROKEN = sorted((REPO / "examples" / "broken").glob("*_broken.py"))
_EXPECT = re.compile(r"#\s*expect:\s*(SPMD\d{3})")


@pytest.fixture(scope="module")
def examples_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    assert BROKEN, "no examples/broken/*_broken.py"
    _, out = run_mypy(EXAMPLES + BROKEN, mypy_config(tmp_path_factory.mktemp("cfg"), plugin=True),
                      CACHE / "plugin", cwd=REPO, extra_args=("--explicit-package-bases",))
    return out


def test_examples_are_clean(examples_run: str) -> None:
    good = {p.name for p in EXAMPLES}
    errors = sorted(k for k in mypy_errors(examples_run) if k[0] in good)
    assert not errors, examples_run


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_twin_is_caught(examples_run: str, path: Path) -> None:
    markers = [(n, m.group(1)) for n, line in enumerate(path.read_text().splitlines(), 1)
               if (m := _EXPECT.search(line))]
    assert len(markers) == 1, f"{path.name} needs exactly one '# expect: SPMD###' marker"
    (line, code), = markers
    spmd = sorted((n, c) for name, n, c in mypy_errors(examples_run)
                  if name == path.name and c.startswith("spmd"))
    # the first error is the marked one (later lines may repeat the mistake: the runtime stops
    # at the first)
    assert spmd, f"{path.name}: not caught statically (marked {code} at line {line})\n{examples_run}"
    assert spmd[0] == (line, f"spmd-{REGISTRY[code].slug}"), \
        f"{path.name}: reported {spmd}, marked {code} at line {line}\n{examples_run}"

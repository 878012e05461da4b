"""The plugin on real code: `examples/*.py` and their broken twins `examples/broken/*_broken.py`.

- No `spmd-*` error in a working example (no false positives on real programs).
- In a broken twin, the first `spmd-*` error is on the line marked `# expect: SPMD###`, with
  that code's mypy spelling; most twins are caught statically (the others need states the
  plugin does not compute).
"""

from __future__ import annotations

import re
from pathlib import Path

from spmdtyped._errors import REGISTRY

from test_typing import CACHE, REPO, mypy_config, mypy_errors, run_mypy

EXAMPLES = sorted((REPO / "examples").glob("*.py"))
BROKEN = sorted((REPO / "examples" / "broken").glob("*_broken.py"))
_EXPECT = re.compile(r"#\s*expect:\s*(SPMD\d{3})")


def test_examples_under_the_plugin(tmp_path: Path) -> None:
    files = [p for p in EXAMPLES + BROKEN if not p.name.startswith("_")]
    assert BROKEN, "no examples/broken/*_broken.py"
    _, out = run_mypy(files, mypy_config(tmp_path, plugin=True), CACHE / "plugin", cwd=REPO,
                      extra_args=("--explicit-package-bases",))
    spmd = {k for k in mypy_errors(out) if k[2].startswith("spmd")}
    good = {p.name for p in EXAMPLES}
    false_positives = sorted(k for k in spmd if k[0] in good)
    assert not false_positives, out

    caught = 0
    for path in BROKEN:
        expect = {(n, f"spmd-{REGISTRY[m.group(1)].slug}")
                  for n, line in enumerate(path.read_text().splitlines(), 1)
                  if (m := _EXPECT.search(line))}
        got = sorted((line, code) for name, line, code in spmd if name == path.name)
        # the first error is the marked one (later lines may repeat the mistake: the runtime
        # stops at the first)
        assert not got or got[0] in expect, f"{path.name}: reported {got}, marked {sorted(expect)}\n{out}"
        caught += bool(got)
    assert caught * 2 >= len(BROKEN), f"only {caught} of {len(BROKEN)} broken examples caught\n{out}"

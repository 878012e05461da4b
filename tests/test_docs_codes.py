"""Every error code the documentation names exists: each `SPMD###` in docs/ (pages, design
notes, the hooks), README.md, mkdocs.yml and the package's READMEs is a code of
`spmdtyped._errors.REGISTRY`, except inside a history block (`<!-- history: ... -->` to
`<!-- /history -->`), whose table maps codes that no longer exist to the registered ones.
"""

from __future__ import annotations

import re
from pathlib import Path

from spmdtyped import _errors

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"SPMD\d{3}")
HISTORY = re.compile(r"<!-- history:.*?<!-- /history -->", re.S)
#: a row of a history table: | SPMD601 old-name | SPMD210 | `spmd-new-slug` ... |
HISTORY_ROW = re.compile(r"^\| (SPMD\d{3}) [\w-]+ \| (SPMD\d{3}) \| `spmd-([\w-]+)`", re.M)


def documents() -> list[Path]:
    files = [p for p in (ROOT / "docs").rglob("*") if p.suffix in (".md", ".py") and p.is_file()]
    files += [ROOT / "README.md", ROOT / "mkdocs.yml", *(ROOT / "spmdtyped").rglob("README.md")]
    return sorted(files)


def test_every_code_named_in_the_docs_is_registered() -> None:
    files = documents()
    assert len(files) > 10 and ROOT / "docs" / "design" / "shard_partial.md" in files
    unknown = []
    named = set()
    for path in files:
        text = HISTORY.sub("", path.read_text())
        for n, line in enumerate(text.splitlines(), 1):
            for code in CODE.findall(line):
                named.add(code)
                if code not in _errors.REGISTRY:
                    unknown.append(f"{path.relative_to(ROOT)}:{n}: {code}")
    assert not unknown, ("codes that are not in spmdtyped._errors.REGISTRY (update them, or "
                         "map them in a history block):\n" + "\n".join(unknown))
    assert len(named) > 20  # the scan reads the codes at all


def test_history_tables_map_to_registered_codes() -> None:
    rows = []
    for path in documents():
        for block in HISTORY.findall(path.read_text()):
            rows += [(path, *m.groups()) for m in HISTORY_ROW.finditer(block)]
    assert rows, "no history table found (docs/design/shard_partial.md has one)"
    for path, old, new, slug in rows:
        where = f"{path.relative_to(ROOT)}: {old} -> {new}"
        assert old not in _errors.REGISTRY, f"{where}: {old} exists, it is not history"
        assert new in _errors.REGISTRY, f"{where}: {new} is not registered"
        assert _errors.REGISTRY[new].slug == slug, f"{where}: {new} is spmd-{_errors.REGISTRY[new].slug}"


def test_a_code_that_does_not_exist_is_found() -> None:
    text = "see SPMD101 and SPMD699\n<!-- history: x -->\nSPMD601\n<!-- /history -->\n"
    found = CODE.findall(HISTORY.sub("", text))
    assert [c for c in found if c not in _errors.REGISTRY] == ["SPMD699"]

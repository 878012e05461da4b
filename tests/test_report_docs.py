"""docs/report.md shows the report of `examples/transformer.py` (table and HTML chart) and of
gradient accumulation written both ways; this test writes those files (`docs/_snippets/
report_*.txt`, `docs/assets/report_transformer.html`) and holds them equal to what
`st.report` prints now. Set SPMDTYPED_WRITE_DOCS=1 to rewrite them."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import _report_programs as rp
import pytest

import spmdtyped as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _check(path: Path, text: str) -> None:
    if os.environ.get("SPMDTYPED_WRITE_DOCS") or not path.exists():
        path.write_text(text)
    assert path.read_text() == text, f"{path} is stale: rerun with SPMDTYPED_WRITE_DOCS=1"


def test_docs_show_the_transformer_report() -> None:
    m = importlib.import_module("examples.transformer")
    mesh = m.make_mesh()
    rep = st.report(m.programs(mesh)[0], *m.make_inputs(mesh))
    _check(ROOT / "docs" / "_snippets" / "report_transformer.txt", rep.table() + "\n")
    _check(ROOT / "docs" / "assets" / "report_transformer.html", rep.html() + "\n")


@pytest.mark.parametrize("which", ["implicit", "deferred"])
def test_docs_show_gradient_accumulation(which: str) -> None:
    rep = st.report(*(lambda s, a: (s, *a))(*rp.accumulation(which)))
    _check(ROOT / "docs" / "_snippets" / f"report_accum_{which}.txt", rep.table() + "\n")

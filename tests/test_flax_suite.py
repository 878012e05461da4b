"""flax's own `nnx.shard_map` tests (`flax_suite/`: the `TestShardMap` class of flax's
`tests/nnx/transforms_test.py` at 18f8f311, vendored unchanged) run as flax wrote them and with
each `nnx.shard_map(f, ...)` checked by `st.adapters.checking` (`flax_suite/entry.py`): every
test that passes as flax runs it passes checked. They cover graph and tree modes, `StateSharding`
/ `nnx.prefix` specs, modules mutated inside the body, RNG streams, `nnx.Variable`s and
aliasing errors: flax's own world of shard_map, which spmdtyped sees only through the jaxpr
flax stages. Slow (two processes, about 25 s)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = pathlib.Path(__file__).parents[1]


def _run(flavor: str, tmp: pathlib.Path) -> dict[str, str]:
    xml = tmp / f"{flavor}.xml"
    env = {**os.environ, "SPMDTYPED_FLAX_SUITE": flavor, "PYTHONPATH": str(ROOT),
           "SPMDTYPED_FLAX_SUITE_CALLS": str(tmp / f"{flavor}.calls"),
           "JAX_PLATFORMS": "cpu", "SPMDTYPED_TEST_JAX_CACHE": "0"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--junitxml", str(xml), "-o", "junit_family=xunit1",
                           str(ROOT / "tests" / "flax_suite" / "entry.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert xml.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    out: dict[str, str] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        status = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed: " + (child.get("message") or "")[:300]
            elif child.tag == "skipped":
                status = "skipped"
        out[str(case.get("name"))] = status
    return out


@pytest.mark.xdist_group("flax_suite")
def test_flax_nnx_shard_map_suite_through_checking(tmp_path: pathlib.Path) -> None:
    raw, typed = _run("raw", tmp_path), _run("typed", tmp_path)
    assert raw.keys() == typed.keys() and len(raw) >= 25
    passed = [t for t, s in raw.items() if s == "passed"]
    assert len(passed) >= 25, raw
    assert {t: typed[t] for t in passed if typed[t] != "passed"} == {}
    # the checked run went through `checking` (one call per nnx.shard_map function called)
    calls = (tmp_path / "typed.calls").read_text().split()
    print(f"\nflax's nnx.shard_map tests: {len(raw)}, {len(passed)} pass as flax runs them; "
          f"checked: {sum(typed[t] == 'passed' for t in passed)} pass ({len(calls)} checked "
          f"calls)")
    assert len(calls) >= 25 and not (tmp_path / "raw.calls").read_text().strip(), calls

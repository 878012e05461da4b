"""JAX's own `tests/shard_map_test.py` (the installed version's, `load.py`) run twice, as JAX
runs it and with `typed_shard_map` in place of `jax.shard_map` (issue 27): every test that
passes raw passes typed, or is a row of `KNOWN` (a bug the engine catches earlier, with its
code, or a documented strict row). Counts are printed (`pytest -s`) and in docs/porting.md.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from jax_suite.load import suite_for

ROOT = pathlib.Path(__file__).parents[1]

#: test id -> (kind, why): "caught" (JAX's test expects an error; spmdtyped raises its own,
#: earlier, with a code) or "strict" (the test computes per device on purpose; documented on
#: the refinement page with its `st.allow`)
KNOWN: dict[str, tuple[str, str]] = {}


def _run(flavor: str, tmp: pathlib.Path) -> dict[str, tuple[str, str]]:
    xml = tmp / f"{flavor}.xml"
    env = {**os.environ, "SPMDTYPED_JAX_SUITE": flavor, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
           "--junitxml", str(xml), "-o", "junit_family=xunit1",
           str(ROOT / "tests" / "jax_suite" / "suite_entry.py")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3000)
    if not xml.exists():
        raise AssertionError(f"the {flavor} suite did not run:\n{done.stdout[-3000:]}"
                             f"\n{done.stderr[-3000:]}")
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        tid = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        status, text = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, text = "failed", (child.get("message") or "") + (child.text or "")
            elif child.tag == "skipped":
                status = "skipped"
        out[tid] = (status, text)
    return out


def classify(raw: dict[str, tuple[str, str]], typed: dict[str, tuple[str, str]]
             ) -> dict[str, list[str]]:
    """Each test of the suite: passed (both), skipped / failing raw (not ours to judge),
    caught / strict (a KNOWN row), crash (typed raised something that is not ours),
    false_positive (an SpmdTypeError that no KNOWN row explains)."""
    got: dict[str, list[str]] = {k: [] for k in ("passed", "skipped", "failing_raw", "caught",
                                                 "strict", "crash", "false_positive")}
    for tid, (status, _) in sorted(raw.items()):
        t_status, t_text = typed.get(tid, ("failed", "missing from the typed run"))
        if status == "skipped":
            got["skipped"].append(tid)
        elif status == "failed":
            got["failing_raw"].append(tid)
        elif t_status == "passed":
            got["passed"].append(tid)
        elif tid in KNOWN:
            got[KNOWN[tid][0]].append(tid)
        elif "SPMD" in t_text and "spmdtyped" in t_text:
            got["false_positive"].append(f"{tid}: {_headline(t_text)}")
        else:
            got["crash"].append(f"{tid}: {_headline(t_text)}")
    return got


def _headline(text: str) -> str:
    for line in text.splitlines():
        if "SPMD" in line or "Error" in line:
            return line.strip()[:300]
    return text.strip().splitlines()[0][:300] if text.strip() else "?"


@pytest.mark.skipif(suite_for() is None, reason="no JAX suite vendored for this JAX version")
def test_jax_shard_map_suite_through_typed_shard_map(tmp_path: pathlib.Path) -> None:
    raw = _run("raw", tmp_path)
    typed = _run("typed", tmp_path)
    got = classify(raw, typed)
    print("\nJAX shard_map_test.py through typed_shard_map: "
          + ", ".join(f"{k} {len(v)}" for k, v in got.items()))
    for k in ("crash", "false_positive"):
        for line in got[k]:
            print(f"  {k}: {line}")
    stale = sorted(set(KNOWN) - {t for k in ("caught", "strict") for t in got[k]})
    assert not got["crash"] and not got["false_positive"], got["crash"] + got["false_positive"]
    assert not stale, f"KNOWN rows that no longer differ: {stale}"
    assert len(got["passed"]) > 0.8 * len(raw), "the suite barely ran"

"""JAX's own `tests/shard_map_test.py` (the file vendored for the installed version,
`jax_suite/load.py`: jax 0.10.2's own; for jax 0.12.0.1, JAX main's at cec06d1) run with
`typed_shard_map` in place of `jax.shard_map` (issue 27): every test that passes as JAX runs
it passes typed, or is a row of `known()` (`KNOWN`, shared by the vendored files, plus the
file's own `KNOWN_BY_SUITE` rows: a bug the engine catches earlier, with its code, or a
documented strict row), and none crashes; a row that no longer differs fails the test.
Counts are printed (`pytest -s`) and in docs/porting.md.

How JAX's run turns out is recorded per JAX version (`jax_suite/raw_<version>.json`: the tests
that skip or fail there; 9 to 14 minutes on 2 cores to rerun), so CI runs the typed suite only;
`python tests/test_jax_suite.py --record` runs the suite as JAX runs it and rewrites the file.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from jax_suite.load import HERE, SUITES, suite_for

from spmdtyped._rules import STRICTER_THAN_JAX

ROOT = pathlib.Path(__file__).parents[1]

#: test id -> (kind, the code typed_shard_map raises there):
#: - "caught": JAX's test expects JAX's error (`assertRaises...`); spmdtyped raises its own,
#:   with the code and the user's line, before or instead of JAX's (the message JAX's test
#:   matches is not spmdtyped's; where spmdtyped's replaces JAX's, it is of JAX's class and
#:   names JAX's first line, `_errors.raised_as`, and such a test passes);
#: - "strict": the test computes per device on purpose, or relies on JAX accepting what a
#:   rule of `_rules.STRICTER_THAN_JAX` refuses (that code's row there, on docs/refinement.md
#:   and docs/porting.md); the program runs under `with st.allow(code):` in its body;
KNOWN: dict[str, tuple[str, str]] = {
    **{f"ShardMapTest::{t}": ("caught", code) for t, code in {
        "test_close_over_explicit_sharded_input_error": "SPMD215",
        "test_cond_pvary_errors": "SPMD302", "test_cond_pvary_errors_pytree": "SPMD302",
        "test_cond_rep_rule": "SPMD401",
        "test_custom_vjp_replication_error_message_hint": "SPMD103",
        "test_error_for_variable_num_args": "SPMD402",
        "test_functools_partial_rank_error": "SPMD402", "test_in_spec_none_rank_errors": "SPMD402",
        "test_matmul_unreduced_error": "SPMD401", "test_no_mesh_context_error": "SPMD506",
        "test_partial_auto_error_wrong_in_specs": "SPMD503",
        "test_pvary_explicit_axes_error": "SPMD501", "test_rank_errors": "SPMD402",
        "test_replication_checker_eager": "SPMD401", "test_replication_checker_jit": "SPMD401",
        "test_scan_pvary_errors": "SPMD302", "test_scan_pvary_errors2": "SPMD302",
        "test_scan_rep_rule": "SPMD401", "test_shmap_empty_mesh_error": "SPMD501",
        "test_tree_prefix_error": "SPMD402", "test_vma_out_specs_error_check": "SPMD401",
        "test_while_rep_rule": "SPMD401",
    }.items()},
    **{f"ShardMapTest::{t}": ("strict", code) for t, code in {
        # a collective over an axis where its input is already Invariant
        "test_all_gather_with_vma_in_types": "SPMD103", "test_pmax_vma_in_types": "SPMD103",
        "test_repeated_psum_allowed": "SPMD103",
        # a replicated array as long as a shard, applied to it elementwise (per device)
        "test_close_over_input_explict_ctx_mesh": "SPMD215",
        "test_one_input_sharded_another_reduced_shmap_add": "SPMD215",
        "test_one_input_sharded_another_reduced_shmap_mul": "SPMD215",
        "test_one_input_sharded_another_reduced_shmap_no_psum_add": "SPMD215",
        "test_one_input_sharded_another_reduced_shmap_no_psum_mul": "SPMD215",
        "test_vmap_shmap_spmd_axis_name_scalar0": "SPMD215",
        "test_vmap_shmap_spmd_axis_name_scalar1": "SPMD215",
        "test_reverse_mode_ad": "SPMD215",
        # a non-linear op of a local sum over a sharded dim (exp(x.sum()) per device)
        **{f"test_res_forwarding_optimization_complex{i}": "SPMD211" for i in range(4)},
        "test_remat_scalar_residuals": "SPMD211",
    }.items()},
}

#: the rows of one vendored file only (`load.SUITES`' file name): a test it alone has, or one
#: whose outcome differs between the JAX versions
KNOWN_BY_SUITE: dict[str, dict[str, tuple[str, str]]] = {
    "jax_0_10_2_shard_map.py": {
        # JAX's error for these changed (or they fail as jax 0.12.0.1 runs cec06d1's file)
        **{f"ShardMapTest::{t}": ("caught", code) for t, code in {
            "test_shmap_auto_unreduced_error": "SPMD403",
        }.items()},
        # a Varying output under out_specs P(unreduced=...) (jax 0.10 casts it, 0.12 refuses;
        # cec06d1's tests no longer rely on the cast)
        **{f"ShardMapTest::{t}": ("strict", "SPMD401") for t in (
            "test_matmul_full_unreduced_out", "test_matmul_unreduced",
            "test_unreduced_replicated_bitcast")},
    },
}


def known(suite: pathlib.Path | None = None) -> dict[str, tuple[str, str]]:
    """The KNOWN rows of a vendored file (the installed JAX version's by default)."""
    suite = suite or suite_for()
    return {**KNOWN, **KNOWN_BY_SUITE.get(suite.name if suite else "", {})}


def _run(flavor: str, tmp: pathlib.Path) -> dict[str, tuple[str, str]]:
    xml = tmp / f"{flavor}.xml"
    # JAX's test case fails a test that changes the compilation cache (tests/conftest.py
    # would turn a persistent one on): SPMDTYPED_TEST_JAX_CACHE=0
    env = {**os.environ, "SPMDTYPED_JAX_SUITE": flavor, "PYTHONPATH": str(ROOT),
           "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "SPMDTYPED_TEST_JAX_CACHE": "0"}
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
    rows = known()
    for tid, (status, _) in sorted(raw.items()):
        t_status, t_text = typed.get(tid, ("failed", "missing from the typed run"))
        if status == "skipped":
            got["skipped"].append(tid)
        elif status == "failed":
            got["failing_raw"].append(tid)
        elif t_status == "passed":
            got["passed"].append(tid)
        elif tid in rows and f"[{rows[tid][1]}]" in t_text:
            got[rows[tid][0]].append(tid)
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


def _recorded() -> pathlib.Path:
    import jax

    return HERE / f"raw_{jax.__version__.replace('.', '_')}.json"


def record(tmp: pathlib.Path) -> dict[str, tuple[str, str]]:
    """Run the suite as JAX runs it and write `_recorded()`."""
    import jax

    raw = _run("raw", tmp)
    outcomes = {t: s for t, (s, _) in sorted(raw.items()) if s != "passed"}
    _recorded().write_text(json.dumps({"jax": jax.__version__, "total": len(raw),
                                       "outcomes": outcomes}, indent=1, sort_keys=True) + "\n")
    return raw


def _raw(typed: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """JAX's own outcomes, from the record (every test it does not list passed there)."""
    data = json.loads(_recorded().read_text())
    assert data["total"] == len(typed), (
        f"the typed run has {len(typed)} tests, JAX's recorded run {data['total']}: "
        "rerun `python tests/test_jax_suite.py --record`")
    return {t: (data["outcomes"].get(t, "passed"), "") for t in typed}


@pytest.mark.skipif(suite_for() is None, reason="no JAX suite vendored for this JAX version")
def test_jax_shard_map_suite_through_typed_shard_map(tmp_path: pathlib.Path) -> None:
    typed = _run("typed", tmp_path)
    raw = _raw(typed)
    got = classify(raw, typed)
    print("\nJAX shard_map_test.py through typed_shard_map: "
          + ", ".join(f"{k} {len(v)}" for k, v in got.items()))
    for k in ("crash", "false_positive"):
        for line in got[k]:
            print(f"  {k}: {line}")
    assert set(KNOWN_BY_SUITE) <= {p.name for p in SUITES.values()}, "a row of no vendored file"
    rows = known()
    stale = sorted(set(rows) - {t for k in ("caught", "strict") for t in got[k]})
    assert not got["crash"] and not got["false_positive"], got["crash"] + got["false_positive"]
    assert not stale, f"KNOWN rows that no longer differ: {stale}"
    strict = {code for kind, code in rows.values() if kind == "strict"}
    assert strict <= {code for code, _case, _why in STRICTER_THAN_JAX}
    assert len(got["passed"]) > 0.8 * len(raw), "the suite barely ran"


if __name__ == "__main__":
    import tempfile

    if "--record" in sys.argv:
        with tempfile.TemporaryDirectory() as tmp:
            got = record(pathlib.Path(tmp))
        print(f"recorded {len(got)} tests in {_recorded()}")
    else:
        sys.exit(pytest.main([__file__, "-q", "-s"]))

"""Per tool, over the porting suites (tests/porting, tests/porting_styles), the bug suite's raw
programs (tests/bugs) and the `check_vma=False` programs (`test_migrate_vma_suites.VMA_OFF` and
the ring attention of tests/porting_vma): programs handled unchanged / total and bugs caught /
total. `pytest -s tests/test_porting_tools.py` prints the table docs/porting.md shows; the test
asserts its floors. Every tool on every program and one mypy run take 15-18 minutes on 2 cores,
and each of those checks already runs in its own suite, so the table is opt-in:
`SPMDTYPED_TOOLS_TABLE=1 pytest -s tests/test_porting_tools.py` (CI leaves it out).

Each cell counts the passing runs of the check that the suite's own test makes (imported from
it, never re-declared): "handled unchanged" is the tool accepting a correct program and giving
its numbers (bit for bit where the suite's test says so, the single-device reference's for the
bug suite's fixed programs); "caught" is the bug reported with its marked code (and, where the
suite's test says so, at its line). `st.adapters.checking(step)` has no test of its own on the
porting suite and the bug suite: its runs are here (`_checking_*`). `port` is the codemod's
checked mode (`test_porting_codemod`), `mypy` is mypy with the plugin on its output; neither
runs on the bug suite's bodies (functions, not modules with a shard_map call). `port
--enable-vma` runs on the `check_vma=False` programs: "unchanged" is migrated to the checks on
with the same numbers, "caught" a change of the numbers or a rejection reported at its line."""

from __future__ import annotations

import os

import bugs
import jax
import numpy as np
import pytest
import test_engine_raw_bugs as raw_bugs
import test_migrate_vma_suites as vma_suites
import test_porting as porting
import test_porting_styles as styles
from test_bug_suite import INFER_CODES
from test_bug_suite import test_infer_accepts_every_fixed_program as infer_fixed
from test_bug_suite import test_infer_reports_each_buggy_program_at_the_bug_line as infer_buggy
from test_porting_codemod import PROGRAMS as CODEMOD_PROGRAMS
from test_porting_codemod import mypy_counts, ported  # noqa: F401 - `ported`: the fixture
from test_porting_codemod import test_checked_port_runs_identically as port_runs
from test_porting_styles import meshes  # noqa: F401 - the fixture

import spmdtyped as st

pytestmark = pytest.mark.skipif(
    not os.environ.get("SPMDTYPED_TOOLS_TABLE"),
    reason="the per-tool table (15-18 min): SPMDTYPED_TOOLS_TABLE=1 pytest -s "
           "tests/test_porting_tools.py")

TOOLS = ("port", "port --enable-vma", "infer", "typed_shard_map", "st.adapters.checking(step)",
         "mypy + plugin on port's output")

#: the floors the counts must reach (measured: docs/porting.md shows the table)
FLOORS = {  # tool: (handled unchanged, bugs caught)
    "port": (20, None), "port --enable-vma": (4, 3), "infer": (34, 38),
    "typed_shard_map": (34, 38), "st.adapters.checking(step)": (34, 38),
    "mypy + plugin on port's output": (20, 22),
}


def _checking_porting(name, mesh):
    mod = porting.load(name)
    want = porting.raw_result(name, mesh)
    got = st.adapters.checking(mod.build(mesh))(*mod.make_args(mesh))
    porting.assert_same(got, want)


def _checking_porting_bug(name, bug, mesh):
    mod = porting.load(name)
    code, _line = porting.bug_marker(mod, bug)
    in_specs, out_specs = mod.BUGS[bug]
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.shard_map(getattr(mod, bug), mesh=mesh, in_specs=in_specs,
                                           out_specs=out_specs))(*mod.make_args(mesh))
    assert ei.value.code == code


def _checking_styles_bug(name, bug, mesh_of):
    mod = styles.load(name)
    mesh = mesh_of(mod)
    # (where JAX rejects the program, the raw tools report JAX's error there: `# REJECTED`)
    code, _line = styles.marker(mod, bug, "REJECTED") or styles.marker(mod, bug)
    with pytest.raises(st.SpmdTypeError) as ei, styles._mesh_context(mod, mesh):
        st.adapters.checking(lambda *a: mod.run(mesh, getattr(mod, bug), *a))(
            *mod.make_args(mesh))
    assert ei.value.code == code


def _bug_fn(m, body):
    return jax.shard_map(body, mesh=m.mesh, in_specs=m.IN_SPECS, out_specs=m.OUT_SPECS)


def _checking_fixed(name):
    m = raw_bugs._module(name)
    inputs = m.make_inputs()
    got = st.adapters.checking(jax.jit(raw_bugs.GRAD_OUTSIDE.get(name, lambda f: f)(
        _bug_fn(m, m.fixed_body))))(*inputs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(m.reference(*inputs)), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=raw_bugs.RTOL,
                                   atol=raw_bugs.ATOL)


def _checking_buggy(name):
    m = raw_bugs._module(name)
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.jit(_bug_fn(m, m.buggy_body)))(*m.make_inputs())
    assert ei.value.code == INFER_CODES[name]


def _passes(check) -> bool:
    try:
        check()
    except Exception:  # noqa: BLE001 - a failing check is a program not handled / not caught
        return False
    return True


def test_per_tool_counts(mesh_dp_tp, meshes, ported, tmp_path, tmp_path_factory, capsys,  # noqa: F811
                         monkeypatch):
    correct = {"porting": porting.PROGRAMS, "porting_styles": styles.PROGRAMS,
               "bugs": bugs.BUG_CLASSES}
    buggy = {"porting": porting.BUGS, "porting_styles": styles.BUGS, "bugs": bugs.BUG_CLASSES}
    handled: dict[str, dict[str, list[bool]]] = {t: {} for t in TOOLS}
    caught: dict[str, dict[str, list[bool]]] = {t: {} for t in TOOLS}

    missed = []

    def run(table, tool, suite, items, check):
        table[tool][suite] = [_passes(lambda i=i: check(i)) for i in items]
        missed.extend(f"  {tool}: {suite} {i}" for i, ok in zip(items, table[tool][suite],
                                                                strict=True) if not ok)

    run(handled, "port", "porting", [p for p in CODEMOD_PROGRAMS if p[0] == "porting"],
        lambda p: port_runs(*p, ported))
    run(handled, "port", "porting_styles",
        [p for p in CODEMOD_PROGRAMS if p[0] == "porting_styles"], lambda p: port_runs(*p, ported))
    run(handled, "infer", "porting", correct["porting"],
        lambda n: porting.test_infer_matches_jax(n, mesh_dp_tp))
    run(handled, "infer", "porting_styles", correct["porting_styles"],
        lambda n: styles.test_infer_unchanged(n, meshes))
    run(handled, "infer", "bugs", correct["bugs"], infer_fixed)
    run(caught, "infer", "porting", buggy["porting"],
        lambda b: porting.test_infer_reports_bug(*b, mesh_dp_tp))
    run(caught, "infer", "porting_styles", buggy["porting_styles"],
        lambda b: styles.test_infer_finds_bug(*b, meshes))
    run(caught, "infer", "bugs", buggy["bugs"], infer_buggy)
    tsm = "typed_shard_map"
    run(handled, tsm, "porting", correct["porting"],
        lambda n: porting.test_typed_shard_map_identical(n, mesh_dp_tp))
    run(handled, tsm, "porting_styles", correct["porting_styles"],
        lambda n: styles.test_typed_shard_map_unchanged(n, meshes))
    run(handled, tsm, "bugs", correct["bugs"],
        lambda n: raw_bugs.test_raw_fixed_program_runs_and_equals_the_reference(n, tsm))
    run(caught, tsm, "porting", buggy["porting"],
        lambda b: porting.test_typed_shard_map_reports_bug(*b, mesh_dp_tp))
    run(caught, tsm, "porting_styles", buggy["porting_styles"],
        lambda b: styles.test_typed_shard_map_finds_bug(*b, meshes))
    run(caught, tsm, "bugs", buggy["bugs"],
        lambda n: raw_bugs.test_raw_buggy_program_caught_where_infer_reports_it(n, tsm))
    chk = "st.adapters.checking(step)"
    run(handled, chk, "porting", correct["porting"], lambda n: _checking_porting(n, mesh_dp_tp))
    run(handled, chk, "porting_styles", correct["porting_styles"],
        lambda n: styles.test_checking_dropin_unchanged(n, meshes))
    run(handled, chk, "bugs", correct["bugs"], _checking_fixed)
    run(caught, chk, "porting", buggy["porting"], lambda b: _checking_porting_bug(*b, mesh_dp_tp))
    run(caught, chk, "porting_styles", buggy["porting_styles"],
        lambda b: _checking_styles_bug(*b, meshes))
    run(caught, chk, "bugs", buggy["bugs"], _checking_buggy)

    # port --enable-vma: the check_vma=False programs
    monkeypatch.syspath_prepend(str(vma_suites.TESTS))
    vma_ok: dict[str, tuple[int, bool]] = {}
    for prog in vma_suites.VMA_OFF:
        vma_ok[prog.name] = (prog.status, _passes(lambda p=prog: vma_suites.test_suite_program_migrates(
            p, tmp_path_factory.mktemp("vma"), capsys, monkeypatch)))
    vma_ok["porting_vma/ring_custom_vjp"] = (0, _passes(
        lambda: vma_suites.test_ring_attention_with_custom_vjp_scan_and_cond(
            tmp_path_factory.mktemp("vma"), capsys)))
    capsys.readouterr()
    missed.extend(f"  port --enable-vma: {name}" for name, (_s, ok) in vma_ok.items() if not ok)
    handled["port --enable-vma"]["vma"] = [ok for status, ok in vma_ok.values() if status == 0]
    caught["port --enable-vma"]["vma"] = [ok for status, ok in vma_ok.values() if status != 0]

    pytest.importorskip("mypy")
    n = mypy_counts(ported, tmp_path)
    mypy = "mypy + plugin on port's output"
    handled[mypy]["porting suites"] = [True] * n["clean"] + [False] * (n["total"] - n["clean"])
    caught[mypy]["porting suites"] = [True] * n["found"] + [False] * (n["infer_found"] - n["found"])

    def cell(per_suite):
        if not per_suite:
            return "—", None
        done = sum(sum(v) for v in per_suite.values())
        total = sum(len(v) for v in per_suite.values())
        parts = ", ".join(f"{s} {sum(v)}/{len(v)}" for s, v in per_suite.items())
        return f"{done}/{total} ({parts})", done

    rows = ["| tool | correct programs handled unchanged | bugs caught |", "|---|---|---|"]
    counts = {}
    for tool in TOOLS:
        (h, hn), (c, cn) = cell(handled[tool]), cell(caught[tool])
        counts[tool] = (hn, cn)
        rows.append(f"| `{tool}` | {h} | {c} |")
    with capsys.disabled():
        print("\n" + "\n".join(rows))
        print("not handled / not caught with the marked code:\n" + "\n".join(missed))
        print("mypy:\n" + "\n".join(n["report"]))
    for tool, (h_floor, c_floor) in FLOORS.items():
        h, c = counts[tool]
        assert h is not None and h >= h_floor, (tool, h, h_floor)
        assert c_floor is None or (c is not None and c >= c_floor), (tool, c, c_floor)

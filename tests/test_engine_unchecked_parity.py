"""The walk of what a `check_vma=False` program computes (`_engine.unchecked`) against JAX's own
states: every program of the porting suite (correct and buggy) and of the bug suite (buggy and
fixed) traced twice, with the checks on (JAX records each output's state) and off (the walk
computes which outputs differ between devices).

An output the walk says differs over an axis where JAX types it Invariant (and not Unreduced)
would be a false SPMD410 in the making: allowed only where the walk found a gradient JAX's
autodiff leaves unsummed without the checks (the programs written for `check_vma=True`, whose
gradients JAX sums itself) and where JAX is the one that is wrong (`JAX_DIFFERS`). The other
way, an output JAX types Varying that the walk says is the same everywhere would be a missed
SPMD410: none on these programs (JAX is conservative only inside them: an all_gather's result
is typed Varying and is the same on every device, and each reaches an output through a
computation with per-device data).
"""

from __future__ import annotations

import importlib

import bugs
import jax
import pytest
from test_porting import BUGS as PORT_BUGS
from test_porting import PROGRAMS as PORT_PROGRAMS
from test_porting import load, program

from spmdtyped import _compat
from spmdtyped._engine.check import check_shard_map, shard_map_eqn
from spmdtyped._engine.unchecked import output_facts

PORT_CASES = [(n, None) for n in PORT_PROGRAMS] + list(PORT_BUGS)
#: where JAX, not the walk, is wrong about an output: (program, variant) -> why
JAX_DIFFERS = {
    # a lax.cond whose predicate varies over tp (axis_index): JAX types the result Invariant
    # (SPMD303, the bug the program is); the branches' results differ per device
    ("cond_axis_index_grad", "buggy_body"): "cond on a varying predicate",
    # jax.vmap(jax.grad(...)) of a per-example loss: with the checks on JAX sums each
    # per-example gradient over dp (jax#36886, SPMD407); without them each stays per device
    ("per_example_grads_vmap", "buggy_body"): "per-example gradients under vmap",
}
BUG_CASES = [(n, v) for n in bugs.BUG_CLASSES for v in ("buggy_body", "fixed_body")]


def _eqn(body, args, mesh, in_specs, out_specs, check_vma):
    smapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                            check_vma=check_vma)
    try:
        return shard_map_eqn(jax.make_jaxpr(smapped)(*args))
    except Exception:  # noqa: BLE001 - a program JAX rejects on one side: nothing to compare
        return None


def _compare(body, args, mesh, in_specs, out_specs):
    """`(extra, fewer)`: per output, the axes the walk says differ and JAX types neither
    Varying nor Unreduced (less those of a gradient left unsummed), and the axes JAX types
    Varying that the walk says are the same everywhere."""
    checked = _eqn(body, args, mesh, in_specs, out_specs, True)
    unchecked = _eqn(body, args, mesh, in_specs, out_specs, False)
    if checked is None or unchecked is None:
        pytest.skip("JAX rejects the program with the checks on or off")
    manual = _compat.shard_map_manual_axes(checked)
    jax_types = check_shard_map(checked, manual=manual, mesh=mesh, source=None,
                                where="parity").out_types
    extra, fewer = [], []
    for i, (t, f) in enumerate(zip(jax_types, output_facts(unchecked, manual), strict=True)):
        unsummed = {a for a, _ in f.unsummed}
        more = f.varying - t.varying - t.unreduced - unsummed
        if more:
            extra.append((i, sorted(more)))
        less = t.varying - f.varying
        if less:
            fewer.append((i, sorted(less)))
    return extra, fewer


@pytest.mark.parametrize("name,bug", PORT_CASES)
def test_porting_programs_differ_where_jax_says_they_vary(name, bug, mesh_dp_tp):
    mod = load(name)
    body, in_specs, out_specs = program(mod, bug)
    extra, fewer = _compare(body, mod.make_args(mesh_dp_tp), mesh_dp_tp, in_specs, out_specs)
    assert not extra, (name, bug, extra)
    assert not fewer, (name, bug, fewer)


@pytest.mark.parametrize("name,variant", BUG_CASES)
def test_bug_programs_differ_where_jax_says_they_vary(name, variant):
    m = importlib.import_module(f"bugs.{name}")
    extra, fewer = _compare(getattr(m, variant), m.make_inputs(), m.mesh, m.IN_SPECS,
                            m.OUT_SPECS)
    assert bool(extra) == ((name, variant) in JAX_DIFFERS), (name, variant, extra)
    assert not fewer, (name, variant, fewer)

"""`st.report` on the porting corpus (`tests/porting/*.py`, `tests/porting_styles/*.py`), each
program on its own mesh and inputs, run as the porting suites run it: the collectives of the
jaxpr (kind, axes, count, bytes) equal what the compiled program runs, and every difference
the compiler makes is named (here: only XLA's all-reduce combiner, per program); the SPMD7xx
flags each program raises."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import pytest
import test_porting as _porting
import test_porting_styles as _styles

import spmdtyped as st

#: how many collectives XLA's all-reduce combiner merges into tuple ops, per program (the
#: only difference the compiler makes in this corpus: same bytes, fewer launches)
COMBINED = {"dp_step": 3, "fsdp_gather": 2, "partial_body": 2, "pytree_params": 5,
            "remat_block": 7, "scan_microbatch": 3, "vma_off_grads": 2}
#: the flags each program raises (every other program raises none): the gradient of a weight
#: gathered over fsdp is all-reduced over tp at the gathered size (2x); a weight used by three
#: remat'd blocks has its gradient all-reduced once per use (3x); per-microbatch gradient
#: psums inside a scan (SPMD701 for each of the loss and the two gradients, 3x the volume)
FLAGS = {"fsdp_gather": [("SPMD705", ("tp",), "2.00x")],
         "remat_block": [("SPMD705", ("dp",), "3.00x")],
         "scan_microbatch": [("SPMD701", ("dp",), "3 iterations")] * 3
         + [("SPMD705", ("dp",), "3.00x")]}
PROGRAMS = [("porting", n) for n in _porting.PROGRAMS] + \
    [("porting_styles", n) for n in _styles.PROGRAMS]


@functools.cache
def _report(suite: str, name: str) -> tuple[Any, str]:
    if suite == "porting":
        mod = _porting.load(name)
        mesh = jax.make_mesh((2, 4), ("dp", "tp"))
        return st.report(mod.build(mesh), *mod.make_args(mesh)), mod.__file__
    mod = _styles.load(name)
    mesh = jax.make_mesh(tuple(s for _, s in mod.AXES), tuple(a for a, _ in mod.AXES))
    ctx = jax.set_mesh(mesh) if getattr(mod, "SET_MESH", False) else contextlib.nullcontext()
    with ctx:
        rep = st.report(lambda *a: mod.run(mesh, getattr(mod, mod.ENTRY), *a),
                        *mod.make_args(mesh))
    return rep, mod.__file__


def test_corpus_size() -> None:
    assert len(PROGRAMS) == 20


@pytest.mark.parametrize("suite,name", PROGRAMS)
def test_porting_program_traced_equals_compiled(suite: str, name: str) -> None:
    rep, path = _report(suite, name)
    assert rep.was_compiled and rep.collectives
    assert rep.summary() == rep.summary("compiled")
    assert rep.removed == [] and rep.added() == []
    assert all(op.origin in ("user", "autodiff", "jax") for op in rep.compiled)
    merged = COMBINED.get(name, 0)
    want = [f"combined by the compiler: {merged} collectives run as operands of tuple ops "
            "(same bytes, fewer launches)"] if merged else []
    assert rep.differences() == want
    want_flags = FLAGS.get(name, [])
    assert [(f.code, f.axes) for f in rep.flags] == [(c, a) for c, a, _ in want_flags]
    assert all(text in f.message for f, (_, _, text) in zip(rep.flags, want_flags, strict=True))
    assert all(f.where and f.where.startswith(path) for f in rep.flags)
    # every collective points at the program's own file (the user's line, not JAX's)
    assert all(c.where and c.where.rsplit(":", 1)[0] == path for c in rep.collectives), \
        [c.where for c in rep.collectives]


def test_shard_map_under_set_mesh_is_compiled() -> None:
    """`@jax.shard_map` under `jax.set_mesh` holds only the abstract mesh: the report takes the
    arguments' concrete mesh and reads the compiled program (it used to report nothing)."""
    rep, _ = _report("porting_styles", "setmesh_mlp")
    assert rep.was_compiled
    assert rep.summary("compiled") == {("all-reduce", ("tp",)): (1, 256)}

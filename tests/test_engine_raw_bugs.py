"""One engine (issue 27): every raw buggy program of the bug suite (tests/bugs/, the bodies
`infer` walks: jnp / jax.nn / jax.lax, no st.* in them) is caught by the runtimes, under
`typed_shard_map` and inside `st.shard_map`, exactly where `infer` reports it (code and line,
at the `# BUG` line with the class's code); the fixed programs run under both and equal their
single-device references."""

from __future__ import annotations

import importlib
import pathlib

import bugs
import jax
import numpy as np
import pytest
from test_bug_suite import INFER_CODES

import spmdtyped as st

ATOL = RTOL = 1e-5


def _module(name):
    return importlib.import_module(f"bugs.{name}")


def _runtime(face, body, m):
    if face == "typed_shard_map":
        return st.adapters.typed_shard_map(body, mesh=m.mesh, in_specs=m.IN_SPECS,
                                           out_specs=m.OUT_SPECS)
    return st.shard_map(body, mesh=m.mesh, in_specs=m.IN_SPECS, out_specs=m.OUT_SPECS)


def _raised(fn, inputs):
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(fn)(*inputs)
    e = ei.value
    return e.code, getattr(e, "file", None), getattr(e, "line", None)


def _same_file(a, b) -> bool:
    return a is not None and pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


@pytest.mark.parametrize("face", ["typed_shard_map", "st.shard_map"])
@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_raw_buggy_program_caught_where_infer_reports_it(name, face):
    m = _module(name)
    path, line = bugs.bug_location(m)
    rep = st.adapters.infer(m.buggy_body, *m.make_inputs(), mesh=m.mesh, in_specs=m.IN_SPECS,
                            out_specs=m.OUT_SPECS)
    first = rep.violations[0]
    code, file, at = _raised(_runtime(face, m.buggy_body, m), m.make_inputs())
    assert (code, at) == (first.code, first.line), (name, face, code, at, first.code, first.line)
    assert _same_file(file, first.file)
    # and it is the class's bug: its code at the `# BUG` line
    assert (code, at) == (INFER_CODES[name], line) and _same_file(file, path)


GRAD_OUTSIDE = {"cond_axis_index_grad": lambda f: jax.grad(lambda x: f(x).sum()),
                "custom_kernel_replicated_grad": jax.grad}


def _unwrapped(body):
    # the body given raw values (st.shard_map hands typed values to a raw body; a
    # pure_callback would receive them too, see docs/runtime.md)
    def raw_body(*args):
        return body(*st.unwrap(args))
    return raw_body


@pytest.mark.parametrize("face", ["typed_shard_map", "st.shard_map"])
@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_raw_fixed_program_runs_and_equals_the_reference(name, face):
    m = _module(name)
    body = m.fixed_body
    if face == "st.shard_map" and name == "custom_kernel_replicated_grad":
        body = _unwrapped(body)   # its host callback computes on numpy arrays
    inputs = m.make_inputs()
    fn = _runtime(face, body, m)
    # the two classes whose quantity is a gradient taken outside the shard_map (`m.fixed`)
    fn = GRAD_OUTSIDE.get(name, lambda f: f)(fn)
    got = jax.jit(fn)(*inputs)
    want = m.reference(*inputs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", ["row_parallel_bias", "vocab_ce_doubled_reduction"])
def test_eager_call_is_checked_and_runs_the_checked_trace(name):
    """Called without jax.jit: the program is traced once per input signature (jax.jit's
    trace, which the call reuses), checked, then run."""
    m = _module(name)
    fn = st.adapters.typed_shard_map(m.buggy_body, mesh=m.mesh, in_specs=m.IN_SPECS,
                                     out_specs=m.OUT_SPECS)
    with pytest.raises(st.SpmdTypeError) as ei:
        fn(*m.make_inputs())
    assert ei.value.code == INFER_CODES[name]
    ok = st.adapters.typed_shard_map(m.fixed_body, mesh=m.mesh, in_specs=m.IN_SPECS,
                                     out_specs=m.OUT_SPECS)
    inputs = m.make_inputs()
    for _ in range(2):
        np.testing.assert_allclose(np.asarray(ok(*inputs)), np.asarray(m.reference(*inputs)),
                                   rtol=RTOL, atol=ATOL)


def test_one_operand_no_longer_decides():
    """The issue's line: the same bias-before-psum with jax.nn.silu / jnp.einsum is SPMD210
    inside st.shard_map, as with st.nn.silu."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    m = _module("row_parallel_bias")

    def body(x, wg, wu, wd, b):
        return jax.lax.psum(jax.nn.silu(x @ wg) * jnp.einsum("bd,df->bf", x, wu) @ wd + b, "tp")

    k = jax.random.split(jax.random.key(0), 5)
    args = (jax.random.normal(k[0], (4, 8)), jax.random.normal(k[1], (8, 16)),
            jax.random.normal(k[2], (8, 16)), jax.random.normal(k[3], (16, 8)),
            jax.random.normal(k[4], (8,)))
    specs = (P("dp", None), P(None, "tp"), P(None, "tp"), P("tp", None), P())
    f = st.shard_map(body, mesh=m.mesh, in_specs=specs, out_specs=P("dp", None))
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(f)(*args)
    assert ei.value.code == "SPMD210"
    assert ei.value.line == body.__code__.co_firstlineno + 1

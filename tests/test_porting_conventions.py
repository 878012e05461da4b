"""JAX's calling conventions in the porting tools: `typed_shard_map`, `infer` and `st.shard_map`
take `jax.shard_map`'s arguments and defaults (mesh from `jax.set_mesh`, `in_specs` inferred),
work as decorators, accept `functools.partial` and jitted bodies; `st.adapters.checking(step)`
checks the unmodified `jax.lax` calls of its shard_maps, from threads too, replacing nothing in
JAX; `typed_shard_map` traces once; pytree collectives bind as
`jax.lax`'s."""

from __future__ import annotations

import functools
import inspect
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.lax as slax


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _put(mesh, a, spec):
    return jax.device_put(a, NamedSharding(mesh, spec))


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()
            if p.kind != p.VAR_POSITIONAL]


def test_signature_is_jax_shard_maps():
    assert _params(st.adapters.typed_shard_map) == _params(jax.shard_map)


def test_st_shard_map_signature_is_jax_shard_maps_with_optional_out_specs():
    # the one deliberate difference: without out_specs, st.shard_map derives the specs from
    # the hints (docs/ecosystem.md, "Specs from annotations")
    want = [(n, k, None if n == "out_specs" else d) for n, k, d in _params(jax.shard_map)]
    # and one added keyword: strict=True reports what the engine cannot follow (issue 27)
    want.append(("strict", inspect.Parameter.KEYWORD_ONLY, False))
    assert _params(st.shard_map) == want


#: `infer`'s keywords beyond `jax.shard_map`'s, each off by default (a port stays a rename)
INFER_ONLY = {"strict": False}


def test_infer_takes_the_same_keywords():
    jax_kw = {n: d for n, k, d in _params(jax.shard_map) if k == inspect.Parameter.KEYWORD_ONLY}
    ours = {n: d for n, k, d in _params(st.adapters.infer) if k == inspect.Parameter.KEYWORD_ONLY}
    assert {n: d for n, d in ours.items() if n not in INFER_ONLY} == jax_kw
    assert {n: ours[n] for n in INFER_ONLY} == INFER_ONLY


def _tp_matmul(x, w):
    return jax.lax.psum(x @ w, "tp")


def test_set_mesh_decorator_and_inferred_in_specs(mesh):
    x = _put(mesh, jnp.arange(64.0).reshape(8, 8), P("dp", "tp"))
    w = _put(mesh, jnp.ones((8, 4)), P("tp", None))
    raw = jax.shard_map(_tp_matmul, mesh=mesh, in_specs=(P("dp", "tp"), P("tp", None)),
                        out_specs=P("dp"))(x, w)
    with jax.set_mesh(mesh):
        @st.adapters.typed_shard_map(out_specs=P("dp"))
        def typed(x, w):
            return jax.lax.psum(x @ w, "tp")

        np.testing.assert_array_equal(typed(x, w), raw)
        rep = st.adapters.infer(_tp_matmul, x, w, out_specs=P("dp"))
        assert rep.ok and rep.signature == ('def _tp_matmul(x: Varying["dp", "tp"], '
                                            'w: Varying["tp"]) -> Varying["dp"]:')

        @st.shard_map(out_specs=P("dp"))
        def typed_st(x, w):
            return st.psum(x @ w, "tp")

        np.testing.assert_array_equal(typed_st(x, w), raw)


def test_mesh_from_context_is_read_at_call_time(mesh):
    fn = st.adapters.typed_shard_map(_tp_matmul, in_specs=(P("dp", "tp"), P("tp", None)),
                                     out_specs=P("dp"))
    x = _put(mesh, jnp.ones((8, 8)), P("dp", "tp"))
    w = _put(mesh, jnp.ones((8, 4)), P("tp", None))
    with pytest.raises(st.SpmdTypeError) as ei:
        fn(x, w)  # no mesh given, none set
    assert ei.value.code == "SPMD506" and "jax.set_mesh" in str(ei.value)
    with jax.set_mesh(mesh):
        np.testing.assert_array_equal(fn(x, w), jnp.full((8, 4), 8.0))


def test_partial_and_jitted_bodies(mesh):
    def scaled(x, *, scale):
        return jax.lax.psum(x * scale, "dp")

    x = _put(mesh, jnp.arange(16.0).reshape(8, 2), P("dp"))
    raw = jax.shard_map(functools.partial(scaled, scale=2.0), mesh=mesh, in_specs=P("dp"),
                        out_specs=P())(x)
    for body in (functools.partial(scaled, scale=2.0),
                 jax.jit(functools.partial(scaled, scale=2.0))):
        fn = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P())
        np.testing.assert_array_equal(fn(x), raw)
        rep = st.adapters.infer(body, x, mesh=mesh, in_specs=P("dp"), out_specs=P())
        assert rep.ok and rep.signature.startswith("def scaled(")

    def bug(x, *, scale):
        return jax.lax.psum(jax.lax.psum(x * scale, "dp"), "dp")

    for body in (functools.partial(bug, scale=2.0), jax.jit(functools.partial(bug, scale=2.0))):
        rep = st.adapters.infer(body, x, mesh=mesh, in_specs=P("dp"), out_specs=P())
        assert [v.code for v in rep.violations] == ["SPMD103"]
        assert rep.violations[0].line == bug.__code__.co_firstlineno + 1


def test_typed_shard_map_traces_the_body_once(mesh):
    """Under jax.jit, as many Python traces of the body as raw `jax.shard_map` makes: the
    shard_map equation JAX staged is the one checked. (Eagerly, the first call per input
    signature traces once to check before running, and JAX's eager call traces again; under
    an autodiff trace the primal program is traced once more to be checked.)"""
    x = _put(mesh, jnp.ones((8, 2)), P("dp"))
    counts = {}
    for tool in ("raw", "typed"):
        calls = counts.setdefault(tool, [])

        def body(x, calls=calls):
            calls.append(1)
            return jax.lax.psum(x, "dp")

        make = jax.shard_map if tool == "raw" else st.adapters.typed_shard_map
        fn = make(body, mesh=mesh, in_specs=P("dp"), out_specs=P())
        jax.jit(fn).lower(x)
        jax.jit(lambda x, fn=fn: fn(x) * 2).lower(x)
    assert len(counts["typed"]) == len(counts["raw"]) >= 1


def test_typed_shard_map_jaxpr_is_the_raw_one(mesh):
    def body(x):
        return jax.lax.psum(x, "dp")

    x = _put(mesh, jnp.ones((8, 2)), P("dp"))
    fn = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P())
    assert str(jax.make_jaxpr(fn)(x)) == str(jax.make_jaxpr(
        jax.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P()))(x))


def test_checking_checks_the_unmodified_step(mesh):
    """A double psum JAX accepts (its auto-pvary hides it): `checking(step)` reports SPMD103 at
    the line, jitted or not, a shard_map seen before included (JAX's cached trace is walked);
    nothing in `jax` or `jax.lax` is replaced, and the same call unwrapped still runs."""
    orig = (jax.lax.psum, jax.shard_map, jax.grad)

    def bug(x):
        return jax.lax.psum(jax.lax.psum(x, "dp"), "dp")

    x = _put(mesh, jnp.ones((8, 2)), P("dp"))
    smapped = jax.shard_map(bug, mesh=mesh, in_specs=P("dp"), out_specs=P())
    jax.make_jaxpr(smapped)(x)  # JAX accepts it
    for step in (smapped, jax.jit(smapped), jax.jit(lambda x: smapped(x) * 2)):
        with pytest.raises(st.SpmdTypeError) as ei:
            st.adapters.checking(step)(x)
        assert ei.value.code == "SPMD103"
        assert ei.value.line == bug.__code__.co_firstlineno + 1
    assert (jax.lax.psum, jax.shard_map, jax.grad) == orig
    np.testing.assert_allclose(smapped(x), np.full((4, 2), 4.0))   # dp=2: summed twice


def test_checking_from_threads(mesh):
    """Checked steps called from several threads at once: each checked, nothing shared."""
    inside = threading.Barrier(4)
    seen = []

    def ok(x):
        return jax.lax.psum(x, "dp")

    def bug(x):
        return jax.lax.psum(jax.lax.psum(x, "dp"), "dp")

    x = _put(mesh, jnp.ones((8, 2)), P("dp"))

    def worker(i):
        body = ok if i % 2 else bug
        step = st.adapters.checking(jax.shard_map(body, mesh=mesh, in_specs=P("dp"),
                                                  out_specs=P()))
        inside.wait()
        try:
            seen.append((i, float(step(x)[0, 0])))
        except st.SpmdTypeError as e:
            seen.append((i, e.code))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen) == [(0, "SPMD103"), (1, 2.0), (2, "SPMD103"), (3, 2.0)]


def test_pytree_collectives_lower_like_jax_lax(mesh):
    def make(lx):
        def f(a, b):
            return (lx.pmean((a, b), "dp"), lx.psum({"x": a, "y": b}, ("dp",)),
                    lx.pmax([a, a * 2], "dp"))

        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("dp"), P("dp")),
                                     out_specs=(P(), P(), P())))

    a = _put(mesh, jnp.ones((8, 4)), P("dp"))
    b = _put(mesh, jnp.ones((8,)), P("dp"))
    assert make(slax).lower(a, b).as_text() == make(jax.lax).lower(a, b).as_text()
    typed = st.adapters.typed_shard_map(
        lambda a, b: jax.lax.pmean((a, b), "dp"), mesh=mesh, in_specs=(P("dp"), P("dp")),
        out_specs=P())
    raw = jax.shard_map(lambda a, b: jax.lax.pmean((a, b), "dp"), mesh=mesh,
                        in_specs=(P("dp"), P("dp")), out_specs=P())
    assert jax.jit(typed).lower(a, b).as_text() == jax.jit(raw).lower(a, b).as_text()


def test_pytree_collective_still_checks_every_leaf(mesh):
    def bug(a, b):
        return jax.lax.pmean((a, jax.lax.psum(b, "dp")), "dp")

    a = _put(mesh, jnp.ones((8, 4)), P("dp"))
    b = _put(mesh, jnp.ones((8,)), P("dp"))
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.shard_map(bug, mesh=mesh, in_specs=(P("dp"), P("dp")),
                                           out_specs=P()))(a, b)
    assert ei.value.code == "SPMD103"

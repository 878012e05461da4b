"""Every error code, triggered through the public API, with its class, attributes and message.

Also: bad input never surfaces as a bare `AssertionError` or a JAX internal error (JAX itself
raises bare AssertionErrors for several of these, reference Q13/Q18).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import local_sds, trace
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat, _errors, _rules

F32 = jnp.float32


def expect(code: str, fn: Any, *, axes: tuple[str, ...] | None = None,
           states: dict[str, str] | None = None, fragments: tuple[str, ...] = (),
           fix: tuple[str, ...] = ()) -> st.SpmdTypeError:
    with pytest.raises(st.SpmdTypeError) as info:
        fn()
    e = info.value
    assert e.code == code, f"expected {code}, got {e.code}: {e}"
    category = _errors.REGISTRY[code].category
    # its category's class, or that class made JAX's too where it replaced JAX's exception
    # (`_errors.raised_as`: tests/test_drop_in_exceptions.py)
    assert type(e) is category or type(e).__bases__ == (category, _errors.jax_class(e)), type(e)
    assert isinstance(e, TypeError)
    msg = str(e)
    assert f"[{code}]" in msg.splitlines()[0]
    if axes is not None:
        assert tuple(e.axes) == axes, e.axes
    if states is not None:
        assert e.states == states, e.states
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in message:\n{msg}"
    for frag in fix:
        assert e.fix is not None and frag in e.fix, f"{frag!r} not in fix {e.fix!r}"
        assert frag in msg
    assert f"explain {code}" in msg
    if _errors.REGISTRY[code].strict:
        assert f"st.allow('{code}')" in msg
    return e


# ------------------------------------------------------------------------------- SPMD1xx


def test_spmd101_reduced_operand_seed(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        r = st.pcast(x, "i", to="reduced")
        st.psum(r, "i")

    e = expect("SPMD101", lambda: trace(mesh_ij, body), axes=("i",), states={"i": "reduced"},
               fragments=("st.psum", "'i'", "Reduced"),
               fix=("st.pcast(x, 'i', to='varying')", "before the reduction", "custom_op"))
    assert isinstance(e, st.AxisStateError)


@pytest.mark.parametrize("op", ["ppermute", "all_gather", "all_to_all", "psum_scatter", "pmean"])
def test_spmd101_every_axis_op(mesh_ij: Any, op: str) -> None:
    calls = {
        "ppermute": lambda r: st.ppermute(r, "j", perm=[(0, 1), (1, 2), (2, 3), (3, 0)]),
        "all_gather": lambda r: st.all_gather(r, "j"),
        "all_to_all": lambda r: st.all_to_all(r, "j", 0, 1, tiled=True),
        "psum_scatter": lambda r: st.psum_scatter(r, "j", tiled=True),
        "pmean": lambda r: st.pmean(r, "j"),
    }

    def body(x: Any) -> None:
        calls[op](st.pcast(x, "j", to="reduced"))

    expect("SPMD101", lambda: trace(mesh_ij, body), axes=("j",), states={"j": "reduced"},
           fragments=(f"st.{op}",))


def test_spmd102_unreduced_operand(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        u = st.pcast(x, "i", to="unreduced")
        st.ppermute(u, "i", perm=[(0, 1), (1, 0)])

    expect("SPMD102", lambda: trace(mesh_ij, body, (P("i"),)), axes=("i",),
           states={"i": "unreduced"}, fragments=("st.ppermute", "Unreduced"),
           fix=("st.psum",))


def test_spmd103_invariant_operand(mesh_ij: Any) -> None:
    expect("SPMD103", lambda: trace(mesh_ij, lambda x: st.psum(x, "j"), (P("i"),)), axes=("j",),
           states={"j": "invariant"}, fragments=("st.psum", "Invariant", "'j'"),
           fix=("st.pvary(x, 'j')",))


def test_spmd103_opt_out_gives_jax_result(mesh_ij: Any) -> None:
    seen = {}

    def body(x: Any) -> None:
        with st.allow("SPMD103"):
            seen["t"] = st.typeof(st.psum(x, "j"))

    trace(mesh_ij, body, (P("i"),))
    assert seen["t"] == st.SpmdType(varying={"i"})


def test_allow_holds_inside_a_differentiated_function(mesh_dp_tp: Any) -> None:
    """`with st.allow(code):` in a function `jax.grad` differentiates: JAX prints the block's
    scope inside the transform (`jvp(spmdtyped_allow_SPMD210)`), and the opt-out holds for the
    engine's violation there (it was ignored: the closing parenthesis stayed in the code).
    The opted-out program computes what raw JAX computes."""
    def step(w1: Any, w2: Any, b: Any, x: Any) -> Any:
        def loss(w1: Any, w2: Any, b: Any) -> Any:
            h = jnp.tanh(x @ w1)
            with st.allow("SPMD210") if allowed else contextlib.nullcontext():
                y = jax.lax.psum(h @ w2 + b, "tp")   # the bias before the psum
            return jnp.mean(y ** 2)

        return jax.grad(loss, (0, 1, 2))(w1, w2, b)

    specs = (P(None, "tp"), P("tp", None), P(), P())
    put = jax.sharding.NamedSharding
    args = [jax.device_put(a, put(mesh_dp_tp, s)) for a, s in zip(
        (jnp.linspace(-1, 1, 128).reshape(8, 16), jnp.linspace(-1, 1, 64).reshape(16, 4),
         jnp.linspace(0, 1, 4), jnp.linspace(-2, 2, 64).reshape(8, 8)), specs, strict=True)]
    io = dict(mesh=mesh_dp_tp, in_specs=specs, out_specs=(P(None, "tp"), P("tp", None), P()))
    allowed = False
    expect("SPMD210", lambda: st.adapters.typed_shard_map(step, **io)(*args))
    allowed = True
    got = st.adapters.typed_shard_map(step, **io)(*args)
    want = jax.jit(jax.shard_map(step, **io))(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_spmd104_mixed_states(mesh_ij: Any) -> None:
    expect("SPMD104", lambda: trace(mesh_ij, lambda x: st.psum(x, ("i", "j")), (P("i"),)),
           axes=("i", "j"), states={"i": "varying", "j": "invariant"},
           fragments=("st.psum", "('i', 'j')"), fix=("st.pvary",))


def test_spmd105_pmean_denominator(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        u = st.pcast(st.pvary(x, "j"), "j", to="unreduced")  # Typed[Varying[i], Unreduced[j]]
        st.pmean(u, "i")

    expect("SPMD105", lambda: trace(mesh_ij, body, (P("i"),)), axes=("j",),
           states={"j": "unreduced"}, fragments=("st.pmean", "'j'"), fix=("st.axis_size",))


def test_spmd106_unreduced_kind(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        st.pmax(st.pcast(x, "i", to="unreduced"), "i")

    e = expect("SPMD106", lambda: trace(mesh_ij, body, (P("i"),)), axes=("i",),
               fragments=("st.pmax",))
    assert "sum" in str(e)


# ------------------------------------------------------------------------------- SPMD2xx


def test_spmd201_unreduced_plus_invariant(mesh_ij: Any) -> None:
    def body(x: Any, b: Any) -> None:
        _ = st.pcast(x, "i", to="unreduced") + b

    e = expect("SPMD201", lambda: trace(mesh_ij, body, (P("i"), P())), axes=("i",),
               fragments=("operator +", "Unreduced"), fix=("st.psum",))
    assert isinstance(e, st.CombineError)


def test_spmd202_nonlinear_on_unreduced(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        _ = st.pcast(x, "i", to="unreduced") ** 2

    expect("SPMD202", lambda: trace(mesh_ij, body, (P("i"),)), axes=("i",),
           states={"i": "unreduced"},
           fragments=("integer_pow", "not linear",
                      # jax 0.12.1 rejects it too; earlier versions silently drop the state
                      *(() if _compat.FEATURES.no_rule_rejects else ("silently",))),
           fix=("st.psum(x, 'i')",))


def test_spmd203_reduced_times_invariant_array(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        _ = st.pcast(x, "i", to="reduced") * x

    expect("SPMD203", lambda: trace(mesh_ij, body), axes=("i",), states={"i": "invariant"},
           fragments=("operator *", "Reduced"), fix=("to='reduced'",))


def test_spmd204_reduced_on_different_axes(mesh_ij: Any) -> None:
    def body(x: Any) -> None:
        _ = st.pcast(x, "i", to="reduced") + st.pcast(x, "j", to="reduced")

    expect("SPMD204", lambda: trace(mesh_ij, body), fragments=("Reduced on different axes",))


def test_spmd205_partial_reduced_cast(mesh_ij: Any) -> None:
    def body(x: Any, w: Any) -> None:
        _ = x + st.pcast(w, "i", to="reduced")   # Varying[i, j] + Reduced[i]

    expect("SPMD205", lambda: trace(mesh_ij, body, (P(("i", "j")), P())), axes=("i",),
           states={"i": "reduced"}, fragments=("Reduced", "Varying"),
           fix=("st.pcast(x, 'i', to='varying')",))


# ------------------------------------------------------------------------------- SPMD3xx


# ------------------------------------------------------------------ the refinement of Varying
# (DESIGN.md §1b): in_specs make Shards, contractions and sums over them make Partials

ROW_PARALLEL = (P("dp", None), P(None, "tp"), P("tp", None), P())


def test_spmd210_bias_added_to_a_partial_sum(mesh_dp_tp: Any) -> None:
    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        _ = (x @ w1) @ w2 + b[0]

    expect("SPMD210", lambda: trace(mesh_dp_tp, body, ROW_PARALLEL, local=(8, 8)), axes=("tp",),
           states={"tp": "varying (partial sums)"}, fragments=("operator +", "bias"),
           fix=("st.psum(x, 'tp')",))

    def norm(x: Any) -> None:   # a layernorm over a tp-sharded hidden dim
        _ = x - st.numpy.mean(x, axis=-1, keepdims=True)

    expect("SPMD210", lambda: trace(mesh_dp_tp, norm, (P("dp", "tp"),)), axes=("tp",),
           fragments=("shard of a global array",))


def test_spmd211_nonlinear_op_on_a_partial_sum_and_softmax_over_a_shard(mesh_dp_tp: Any) -> None:
    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        _ = st.numpy.tanh((x @ w1) @ w2)

    expect("SPMD211", lambda: trace(mesh_dp_tp, body, ROW_PARALLEL), axes=("tp",),
           fragments=("st.numpy.tanh", "tanh is not linear"))
    expect("SPMD211", lambda: trace(mesh_dp_tp, lambda z: st.nn.softmax(z, axis=-1),
                                    (P("dp", "tp"),)),
           axes=("tp",), fragments=("st.nn.softmax", "normalises"), fix=("st.pmax", "st.psum"))


def test_spmd212_divisor_is_a_partial_sum(mesh_dp_tp: Any) -> None:
    def body(loss: Any, mask: Any) -> None:
        _ = (loss * mask).sum() / mask.sum()

    expect("SPMD212", lambda: trace(mesh_dp_tp, body, (P("dp"), P("dp"))), axes=("dp",),
           fragments=("operator /", "divisor"), fix=("st.psum(d, 'dp')",))


def test_spmd213_partial_sum_selected_per_device(mesh_dp_tp: Any) -> None:
    def body(h: Any, w: Any) -> None:
        p = h @ w                                     # Partial over tp
        _ = st.numpy.where(st.axis_index("tp") > 0, p, 0.0)

    expect("SPMD213", lambda: trace(mesh_dp_tp, body, (P(None, "tp"), P("tp"))),
           axes=("tp",), fragments=("st.numpy.where", "predicate varies"))


def test_spmd108_shard_gradient_summed_over_its_own_axis(mesh_dp_tp: Any) -> None:
    def grad_of(w: Any) -> Any:
        return st.grad(lambda v: (v * v).sum())(w)   # the gradient of a Shard is that Shard

    e = expect("SPMD108", lambda: trace(mesh_dp_tp, lambda w: st.psum(grad_of(w), "tp"),
                                        (P("tp"),)),
               axes=("tp",), fragments=("st.psum", "slices", "gradient"), fix=("st.all_gather",))
    assert isinstance(e, st.AxisStateError)
    with st.allow("SPMD108"):
        trace(mesh_dp_tp, lambda w: st.psum(grad_of(w), "tp"), (P("tp"),))
    # not a gradient: a stack of per-device terms, whose psum is right
    trace(mesh_dp_tp, lambda g: st.psum(g, "tp"), (P("tp"),))
    trace(mesh_dp_tp, lambda g: st.psum(g.sum(0), "tp"), (P("tp"),))   # a partial sum: fine


def test_spmd215_replicated_values_along_a_shard(mesh_dp_tp: Any) -> None:
    def body(q: Any, per_head: Any) -> None:
        _ = q * per_head[: q.shape[0]]               # the first device's heads on every device

    expect("SPMD215", lambda: trace(mesh_dp_tp, body, (P("tp"), P())), axes=("tp",),
           fragments=("operator *", "same values"))
    # constants and per-device values of extent 1 along the shard are fine
    trace(mesh_dp_tp, lambda q, b: q * st.numpy.ones(q.shape) + b[0, 0], (P("tp"), P()))


def test_spmd216_diagonal_block(mesh_dp_tp: Any) -> None:
    def scores(q: Any, k: Any) -> Any:   # rows sharded over tp on both sides: the local block
        return jax.nn.softmax(q @ k.T, axis=-1) @ k

    e = expect("SPMD216", lambda: trace(mesh_dp_tp, scores, (P("tp"), P("tp")), P("tp"),
                                        smap=st.adapters.typed_shard_map),
               axes=("tp",), states={"tp": "a diagonal block"},
               fragments=("dot_general", "diagonal block"), fix=("all_gather",))
    assert isinstance(e, st.CombineError)

    def gathered(q: Any, k: Any) -> Any:
        k = jax.lax.all_gather(k, "tp", tiled=True)
        return jax.nn.softmax(q @ k.T, axis=-1) @ k

    trace(mesh_dp_tp, gathered, (P("tp"), P("tp")), P("tp"), smap=st.adapters.typed_shard_map)


def test_spmd301_unsupported_cast(mesh_ij: Any) -> None:
    e = expect("SPMD301", lambda: trace(mesh_ij, lambda x: st.pcast(x, "i", to="varying"), (P("i"),)),
               axes=("i",), states={"i": "varying"}, fragments=("st.pcast", "Varying"))
    assert isinstance(e, st.CastError)


@pytest.mark.parametrize("start,to", [("varying", "reduced"), ("invariant", "unreduced"),
                                      ("unreduced", "varying")])
def test_spmd301_other_casts(mesh_ij: Any, start: str, to: str) -> None:
    def body(x: Any) -> None:
        v = x
        if start == "unreduced":
            v = st.pcast(x, "i", to="unreduced")
        st.pcast(v, "i", to=to)

    spec = P() if start == "invariant" else P("i")
    expect("SPMD301", lambda: trace(mesh_ij, body, (spec,)), axes=("i",), states={"i": start})


# ------------------------------------------------------------------------------- SPMD4xx


def test_spmd401_out_spec_state(mesh_ij: Any) -> None:
    e = expect("SPMD401", lambda: trace(mesh_ij, lambda x: x * 2.0, (P("i"),), out_specs=P()),
               axes=("i",), states={"i": "varying"}, fragments=("P()", "'i'", "Varying"),
               fix=("st.psum(y, 'i')",))
    assert isinstance(e, st.BoundaryError)


def test_spmd402_spec_structure(mesh_ij: Any) -> None:
    f = st.shard_map(lambda x, y: x + y, mesh=mesh_ij, in_specs=(P("i"),), out_specs=P("i"))
    x = jax.device_put(np.zeros((16, 8), np.float32), NamedSharding(mesh_ij, P("i")))
    expect("SPMD402", lambda: f(x, x), fragments=("in_specs",))


def test_spmd402_out_spec_structure(mesh_ij: Any) -> None:
    expect("SPMD402", lambda: trace(mesh_ij, lambda x: (x, x), (P(),), out_specs=(P(), P(), P())),
           fragments=("out_specs",))


def test_spmd403_in_spec_not_honoured(mesh_ij: Any) -> None:
    f = st.shard_map(lambda x: x, mesh=mesh_ij, in_specs=P("i"), out_specs=P("i"))
    x = jax.device_put(np.zeros((16, 8), np.float32), NamedSharding(mesh_ij, P()))  # not P("i")
    expect("SPMD403", lambda: f(x), fragments=("in_specs",))


# ------------------------------------------------------------------------------- SPMD5xx


def test_spmd501_unknown_axis_suggests_closest(mesh_dp_tp: Any) -> None:
    e = expect("SPMD501", lambda: trace(mesh_dp_tp, lambda x: st.psum(x, "tpp"), (P("tp"),)),
               axes=("tpp",), fragments=("'tpp'", "did you mean 'tp'?"),
               fix=("st.psum(x, 'tp')",))
    assert isinstance(e, st.UsageError)


def test_spmd502_axes_as_set(mesh_ij: Any) -> None:
    expect("SPMD502", lambda: trace(mesh_ij, lambda x: st.psum(x, {"i", "j"}), (P(("i", "j")),)),
           fragments=("set",), fix=("('i', 'j')",))


def test_spmd503_non_manual_axis(mesh_ij: Any) -> None:
    expect("SPMD503", lambda: trace(mesh_ij, lambda x: st.psum(x, "j"), (P("i"),), axis_names={"i"}),
           axes=("j",), fragments=("'j'", "not manual"), fix=("axis_names",))


@pytest.mark.parametrize("make", [
    lambda: st.Varying[()],
    lambda: st.Varying["i", "i"],
    lambda: st.Typed[st.Varying["i"], st.Reduced["i"]],
    lambda: st.Reduced[3],
    lambda: st.SpmdType(varying={"i"}, reduced={"i"}),
], ids=["empty", "duplicate", "two-states", "not-a-name", "spmdtype-overlap"])
def test_spmd504_malformed_hint(make: Any) -> None:
    expect("SPMD504", make)


def test_spmd508_allow_of_non_strict_code() -> None:
    def enter() -> None:
        with st.allow("SPMD101"):
            pass

    expect("SPMD508", enter, fragments=("st.allow", "SPMD103", "SPMD202"))


@pytest.mark.parametrize("call", [
    lambda x: st.pcast(x, "i", to="invariant"),
    lambda x: st.all_gather(x, "i", to="replicated"),
], ids=["pcast", "all_gather"])
def test_spmd505_unknown_target(mesh_ij: Any, call: Any) -> None:
    expect("SPMD505", lambda: trace(mesh_ij, call, (P("i"),)), fragments=("to=",))


def test_spmd409_nested_shard_map_over_a_manual_axis(mesh_dp_tp: Any) -> None:
    inner = st.shard_map(lambda v: v * 2.0, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"))
    expect("SPMD409", lambda: trace(mesh_dp_tp, lambda x: inner(x), (P("dp"),)),
           axes=("dp", "tp"), fragments=("manual already", "['dp', 'tp']"),
           fix=("call the function directly",))


def test_spmd410_gradient_never_summed_under_check_vma_false(mesh_dp_tp: Any) -> None:
    def step(w: Any, x: Any) -> Any:
        return jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

    f = st.adapters.typed_shard_map(step, mesh=mesh_dp_tp, in_specs=(P(), P("dp")),
                                    out_specs=P(), check_vma=False)
    w = jax.device_put(jnp.ones((8, 4)), jax.sharding.NamedSharding(mesh_dp_tp, P()))
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), jax.sharding.NamedSharding(mesh_dp_tp, P("dp")))
    e = expect("SPMD410", lambda: f(w, x), axes=("dp",),
               fragments=("never summed over 'dp'", "check_vma=False", "output leaf 0",
                          "out_specs P()"),
               fix=("jax.lax.pmean(grads, 'dp')", "check_vma=True"))
    assert e.line == step.__code__.co_firstlineno + 1   # the line that took the gradient


def test_spmd411_psum_differentiated_under_check_vma_false(mesh_dp_tp: Any) -> None:
    def step(w1: Any, w2: Any, x: Any) -> Any:
        def loss(w1: Any, w2: Any) -> Any:
            return jnp.mean(jax.lax.psum(jnp.tanh(x @ w1) @ w2, "tp") ** 2)

        return jax.grad(loss, (0, 1))(w1, w2)

    f = st.adapters.typed_shard_map(step, mesh=mesh_dp_tp, in_specs=(P(None, "tp"), P("tp"), P()),
                                    out_specs=(P(None, "tp"), P("tp")), check_vma=False)
    put = jax.sharding.NamedSharding
    args = (jax.device_put(jnp.ones((8, 16)), put(mesh_dp_tp, P(None, "tp"))),
            jax.device_put(jnp.ones((16, 4)), put(mesh_dp_tp, P("tp"))),
            jax.device_put(jnp.ones((8, 8)), put(mesh_dp_tp, P())))
    e = expect("SPMD411", lambda: f(*args), axes=("tp",),
               fragments=("jax.lax.psum over 'tp' differentiated under check_vma=False",
                          "'tp''s size times too large", "the gradient taken at"),
               fix=("check_vma=True", "custom_vjp", "outside the shard_map"))
    assert e.line == step.__code__.co_firstlineno + 2   # the psum's line


def test_spmd412_cotangent_left_partial_under_check_vma_false(mesh_dp_tp: Any) -> None:
    @jax.custom_vjp
    def all_reduce(y: Any) -> Any:
        return jax.lax.psum(y, "tp")

    all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))

    def step(w1: Any, w2: Any, x: Any) -> Any:
        def loss(w1: Any, w2: Any) -> Any:
            h = x
            for i in range(2):
                h = h + all_reduce(jnp.tanh(h @ w1[i]) @ w2[i])
            return jnp.mean(h ** 2)

        return jax.grad(loss, (0, 1))(w1, w2)

    specs = (P(None, None, "tp"), P(None, "tp", None))
    f = st.adapters.typed_shard_map(step, mesh=mesh_dp_tp, in_specs=(*specs, P()),
                                    out_specs=specs, check_vma=False)
    put = jax.sharding.NamedSharding
    args = (jax.device_put(jnp.ones((2, 8, 16)), put(mesh_dp_tp, specs[0])),
            jax.device_put(jnp.ones((2, 16, 8)), put(mesh_dp_tp, specs[1])),
            jax.device_put(jnp.ones((8, 8)), put(mesh_dp_tp, P())))
    e = expect("SPMD412", lambda: f(*args), axes=("tp",),
               fragments=("cotangent left partial over 'tp' under check_vma=False",
                          "a parameter sharded over 'tp'", "the gradient taken at"),
               fix=("copy-to-tensor-parallel", "jax.lax.psum(ct, 'tp')", "check_vma=True"))
    assert e.line == step.__code__.co_firstlineno + 4   # the column-parallel matmul's line


def test_spmd401_unreduced_out_spec_in_partial_manual(mesh_dp_tp: Any) -> None:
    expect("SPMD401", lambda: st.shard_map(lambda v: v, mesh=mesh_dp_tp, in_specs=P(),
                                           out_specs=P(unreduced={"tp"}), axis_names={"tp"}),
           fragments=("out_specs P(unreduced={'tp'}", "full-manual", "manual axes: ['tp']"),
           fix=("drop axis_names",))


#: (case, call, message fragments) of SPMD509: each names the API, the argument, what it got
#: and what it expects
BAD_ARGUMENTS: list[tuple[str, Any, tuple[str, ...]]] = [
    ("mesh as an axis name",
     lambda m: st.shard_map(lambda v: v, mesh="dp", in_specs=P(), out_specs=P()),
     ("st.shard_map", "mesh must be a jax.sharding.Mesh", "got str 'dp'")),
    ("int in out_specs", lambda m: st.shard_map(lambda v: v, mesh=m, in_specs=P(), out_specs=P(1)),
     ("out_specs entry of P(1,)", "got int 1", "axis name")),
    ("out_specs not a spec", lambda m: st.shard_map(lambda v: v, mesh=m, in_specs=P(), out_specs="dp"),
     ("out_specs must be a PartitionSpec", "got str 'dp'")),
    ("axis_names=5", lambda m: st.shard_map(lambda v: v, mesh=m, in_specs=P(), out_specs=P(),
                                            axis_names=5),
     ("axis_names must be a set of mesh axis names", "got int 5")),
    ("shard_map of a non-callable", lambda m: st.shard_map(5, mesh=m, in_specs=P(), out_specs=P()),
     ("st.shard_map", "must be a callable", "got int 5")),
    ("grad argnums past the arguments",
     lambda m: trace(m, lambda v: st.grad(lambda w: st.numpy.sum(w), argnums=3)(v)),
     ("st.grad", "argnums must be positions of the 1 positional argument", "got int 3")),
    ("grad argnums of a str", lambda m: st.grad(lambda w: w, argnums="0"),
     ("argnums must be an int", "got str '0'")),
    ("grad of a non-callable", lambda m: st.grad(5), ("st.grad", "must be a callable")),
    ("ppermute index outside the axis",
     lambda m: trace(m, lambda v: st.ppermute(st.pvary(v, "tp"), "tp", [(0, 9)])),
     ("st.ppermute", "perm must be", "0..3 along 'tp'", "got list [(0, 9)]")),
    ("ppermute perm an int", lambda m: trace(m, lambda v: st.ppermute(st.pvary(v, "tp"), "tp", 5)),
     ("st.ppermute", "perm must be", "got int 5")),
    ("ppermute repeated destination",
     lambda m: trace(m, lambda v: st.ppermute(st.pvary(v, "tp"), "tp", [(0, 1), (2, 1)])),
     ("each source and each destination once",)),
    ("pshuffle not a permutation",
     lambda m: trace(m, lambda v: st.pshuffle(st.pvary(v, "tp"), "tp", [0, 0, 1, 2])),
     ("st.pshuffle", "a permutation of 0..3")),
    ("all_to_all split_axis past the rank",
     lambda m: trace(m, lambda v: st.all_to_all(st.pvary(v, "tp"), "tp", 7, 0, tiled=True)),
     ("st.all_to_all", "split_axis must be a dimension of the rank-2 operand", "got int 7")),
    ("all_to_all concat_axis not an int",
     lambda m: trace(m, lambda v: st.all_to_all(st.pvary(v, "tp"), "tp", 0, "a", tiled=True)),
     ("concat_axis must be an int",)),
    ("all_to_all split over an uneven dimension",
     lambda m: trace(m, lambda v: st.all_to_all(st.pvary(v, "tp"), "tp", 0, 1, tiled=True),
                     local=(6, 8)),
     ("has 6 elements", "4 devices along 'tp'")),
    ("psum_scatter dimension past the rank",
     lambda m: trace(m, lambda v: st.psum_scatter(st.pvary(v, "tp"), "tp", scatter_dimension=5)),
     ("st.psum_scatter", "scatter_dimension must be a dimension", "got int 5")),
    ("all_gather axis past the rank",
     lambda m: trace(m, lambda v: st.all_gather(st.pvary(v, "tp"), "tp", axis=4, tiled=True)),
     ("st.all_gather", "axis must be a dimension",)),
    ("cond on None", lambda m: trace(m, lambda v: st.cond(None, lambda x: x, lambda x: x, v)),
     ("st.cond", "pred must be a bool", "got NoneType")),
    ("switch index None", lambda m: trace(m, lambda v: st.switch(None, [lambda x: x], v)),
     ("st.switch", "index must be an int",)),
    ("fori_loop upper None", lambda m: trace(m, lambda v: st.fori_loop(0, None, lambda i, c: c, v)),
     ("st.fori_loop", "upper must be an int",)),
    ("grad of a non-scalar loss", lambda m: trace(m, lambda v: st.grad(lambda w: w)(v)),
     ("st.grad", "the loss) must be a scalar",)),
    ("grad of None", lambda m: trace(m, lambda v: st.grad(lambda w: w)(None)),
     ("st.grad", "the loss) must be a scalar", "got NoneType")),
    ("psum of a str", lambda m: trace(m, lambda v: st.pmean("x", "tp")),
     ("st.pmean", "an array operand must be", "got str 'x'")),
    ("st.numpy of a list", lambda m: trace(m, lambda v: st.numpy.sum([1.0, 2.0])),
     ("an array operand must be", "got list")),
    ("st.numpy.sum over an axis past the rank",
     lambda m: trace(m, lambda v: st.numpy.sum(st.pvary(v, "tp"), axis=7)),
     ("st.numpy.sum", "the arguments were rejected", "axis 7")),
    ("st.numpy.mean over a float axis",
     lambda m: trace(m, lambda v: st.numpy.mean(st.pvary(v, "tp"), axis=1.5)),
     ("st.numpy.mean", "the arguments were rejected")),
    ("astype to a dtype that is none", lambda m: trace(m, lambda v: st.pvary(v, "tp").astype("bogus")),
     ("dtype must be a dtype", "got str 'bogus'")),
    ("fori_loop whose carry changes shape",
     lambda m: trace(m, lambda v: st.fori_loop(0, 2, lambda i, c: st.numpy.sum(c), v)),
     ("st.fori_loop", "the arguments were rejected")),
    ("cond of a non-callable", lambda m: trace(m, lambda v: st.cond(True, 5, lambda x: x, v)),
     ("st.cond", "true_fun must be a callable", "got int 5")),
    ("switch of a non-callable branch", lambda m: trace(m, lambda v: st.switch(0, [5], v)),
     ("st.switch", "branches[0] must be a callable")),
    ("switch with no branches", lambda m: trace(m, lambda v: st.switch(0, [], v)),
     ("branches must be a non-empty list",)),
    ("fori_loop of a non-callable", lambda m: trace(m, lambda v: st.fori_loop(0, 2, None, v)),
     ("st.fori_loop", "body_fun must be a callable")),
    ("typed_shard_map mesh as an axis name",
     lambda m: st.adapters.typed_shard_map(lambda v: v, mesh="dp", in_specs=P(), out_specs=P()),
     ("typed_shard_map", "mesh must be a jax.sharding.Mesh")),
    ("infer with an int in in_specs",
     lambda m: st.adapters.infer(lambda v: v, jnp.ones((8, 4)), mesh=m, in_specs=P(1),
                                 out_specs=P()),
     ("st.adapters.infer", "in_specs entry of P(1,)", "got int 1")),
    ("infer of a non-callable",
     lambda m: st.adapters.infer(5, jnp.ones((8, 4)), mesh=m, in_specs=P(), out_specs=P()),
     ("st.adapters.infer", "must be a callable")),
    ("opaque of a non-callable", lambda m: st.opaque(5), ("st.opaque", "must be a callable")),
    ("custom_op of a non-callable", lambda m: st.custom_op("f"), ("st.custom_op", "must be a callable")),
    ("wrap(None)", lambda m: st.wrap(None), ("st.wrap", "raw must be a JAX array", "got NoneType")),
]


@pytest.mark.parametrize("case", [c for c, _, _ in BAD_ARGUMENTS])
def test_spmd509_bad_argument(mesh_dp_tp: Any, case: str) -> None:
    call, fragments = next((fn, fr) for c, fn, fr in BAD_ARGUMENTS if c == case)
    e = expect("SPMD509", lambda: call(mesh_dp_tp), fragments=fragments)
    assert isinstance(e, st.UsageError) and isinstance(e, TypeError)


def test_spmd503_spec_names_an_axis_that_is_not_manual(mesh_dp_tp: Any) -> None:
    for what in ("in_specs", "out_specs"):
        specs = {"in_specs": P(), "out_specs": P(), what: P("tp")}
        expect("SPMD503", lambda specs=specs: st.shard_map(lambda v: v, mesh=mesh_dp_tp,
                                                           axis_names={"dp"}, **specs),
               axes=("tp",), fragments=(what, "'tp' is not manual"))


def test_spmd501_local_checks_its_axes(mesh_dp_tp: Any) -> None:
    expect("SPMD501", lambda: trace(mesh_dp_tp, lambda v: st.local(st.pvary(v, "tp"), "tq")),
           axes=("tq",), fragments=("st.local", "'tq'", "did you mean 'tp'?"))


def test_spmd506_outside_shard_map() -> None:
    expect("SPMD506", lambda: st.psum(jnp.ones(3), "i"), fragments=("st.psum", "outside shard_map"),
           fix=("st.shard_map",))


# ------------------------------------------------- custom ops, loops, autodiff (issue 4 codes)


def api(name: str, module: str) -> Any:
    """The public `st.<name>`, or its defining module's while the package wires it up."""
    try:
        return getattr(st, name)
    except AttributeError:
        return getattr(importlib.import_module(f"spmdtyped.{module}"), name)


def test_spmd107_custom_op_requires(mesh_ij: Any) -> None:
    custom_op = api("custom_op", "_custom")
    allreduce = custom_op(lambda x: jax.lax.psum(x, "i"), requires={"i": "varying"},
                          produces={"i": "invariant"}, name="my_allreduce")
    expect("SPMD107", lambda: trace(mesh_ij, lambda x: allreduce(x), (P("j"),)), axes=("i",),
           fragments=("my_allreduce", "'i'"))


def test_spmd507_custom_op_declaration() -> None:
    custom_op = api("custom_op", "_custom")
    expect("SPMD507", lambda: custom_op(lambda x: x, requires={"i": "varying",
                                                               "x": {"i": "varying"}}),
           fragments=("requires",))


def test_spmd902_custom_op_result_more_varying_than_declared(mesh_ij: Any) -> None:
    custom_op = api("custom_op", "_custom")
    liar = custom_op(lambda x: x, produces={"i": "invariant"}, name="liar")
    expect("SPMD902", lambda: trace(mesh_ij, lambda x: liar(x), (P("i"),)), axes=("i",),
           fragments=("liar", "Varying", "Invariant"))


def test_spmd302_loop_carry_state(mesh_ij: Any) -> None:
    fori_loop = api("fori_loop", "_control")

    def body(x: Any) -> None:
        u = st.pcast(x, "i", to="unreduced")
        fori_loop(0, 2, lambda k, c: st.psum(c, "i"), u)

    e = expect("SPMD302", lambda: trace(mesh_ij, body, (P("i"),)), axes=("i",),
               fragments=("fori_loop", "Unreduced", "Invariant"))
    assert isinstance(e, st.CastError)


def test_spmd404_cotangent_state(mesh_ij: Any) -> None:
    vjp = api("vjp", "_autodiff")

    def body(x: Any) -> None:
        y, pull = vjp(lambda v: v * v, x)          # y: Varying['i']
        pull(jnp.ones(y.shape, jnp.float32))       # an Invariant cotangent

    expect("SPMD404", lambda: trace(mesh_ij, body, (P("i"),)), axes=("i",),
           fragments=("cotangent", "'i'"))


def test_spmd405_grad_of_reduced_loss(mesh_ij: Any) -> None:
    grad = api("grad", "_autodiff")

    def body(x: Any) -> None:
        r = st.pcast(x, "i", to="reduced")
        grad(lambda w: (w * w).sum())(r)

    if _compat.FEATURES.reduced_loss_grad:  # jax 0.12.1 seeds a Reduced loss: runs
        trace(mesh_ij, body)
        return
    expect("SPMD405", lambda: trace(mesh_ij, body), axes=("i",), states={"i": "reduced"},
           fragments=("loss", "Reduced"))


def test_spmd405_grad_of_unreduced_loss(mesh_ij: Any) -> None:
    grad = api("grad", "_autodiff")

    def body(x: Any) -> None:
        grad(lambda w: st.pcast(w, "i", to="unreduced").sum())(st.pvary(x, "i"))

    expect("SPMD405", lambda: trace(mesh_ij, body), axes=("i",), states={"i": "unreduced"},
           fragments=("loss", "Unreduced"), fix=("st.psum(loss, 'i')",))



@pytest.mark.skipif(_compat.FEATURES.loop_transposes_reduced,
                    reason="jax 0.12.1 differentiates loops over Reduced values (tests/test_autodiff.py)")
def test_spmd406_loop_with_reduced_constant(mesh_ij: Any) -> None:
    grad = api("grad", "_autodiff")
    fori_loop = api("fori_loop", "_control")

    def body(x: Any) -> None:
        r = st.pcast(x, "i", to="reduced")
        v = st.pvary(x, "i")
        grad(lambda w: fori_loop(0, 2, lambda k, c: c * w, v).sum())(r)

    expect("SPMD406", lambda: trace(mesh_ij, body), axes=("i",), states={"i": "reduced"},
           fragments=("loop", "Reduced"), fix=("st.pcast(w, 'i', to='varying')",))


# ------------------------------------------------------------------------------- SPMD9xx


def test_spmd901_check_mode_catches_a_wrong_table(mesh_ij: Any, monkeypatch: Any) -> None:
    rule = _rules.AXIS_OPS["ppermute"]
    wrong = dataclasses.replace(rule, on={**rule.on, _rules.V: _rules.I})
    monkeypatch.setitem(_rules.AXIS_OPS, "ppermute", wrong)
    e = expect("SPMD901", lambda: trace(mesh_ij, lambda x: st.ppermute(x, "i", perm=[(0, 1), (1, 0)]),
                                      (P("i"),)), fragments=("st.ppermute", jax.__version__))
    assert isinstance(e, st.InternalConsistencyError)
    with st.check_mode(False):   # the documented escape hatch
        trace(mesh_ij, lambda x: st.ppermute(x, "i", perm=[(0, 1), (1, 0)]), (P("i"),))


# ------------------------------------------------------------------------------- explain


@pytest.mark.parametrize("code", sorted(_errors.REGISTRY))
def test_explain_page(code: str) -> None:
    page = st.explain(code)
    info = _errors.REGISTRY[code]
    assert page.startswith(f"# {code}: {info.title}")
    for section in ("## What it means", "## Solutions", "## Example fix", "## When it happens"):
        assert section in page
    assert f"spmd-{info.slug}" in page
    assert st.explain(code.lower()) == page


def test_spmd508_explain_unknown_code() -> None:
    expect("SPMD508", lambda: st.explain("SPMD999"), fragments=("st.explain", "'SPMD999'"))
    expect("SPMD508", lambda: st.explain("SPMD1O1"), fragments=("did you mean 'SPMD101'",),
           fix=("st.explain('SPMD101')",))


# ------------------------------------------------------------------------------- no bare errors

BAD_INPUTS = {
    "unknown axis psum": lambda x: st.psum(x, "k"),
    "unknown axis ppermute": lambda x: st.ppermute(x, "k", perm=[(0, 1)]),
    "unknown axis pcast": lambda x: st.pcast(x, "k", to="reduced"),
    "unknown axis all_gather": lambda x: st.all_gather(x, "k"),
    "unknown axis axis_index": lambda x: st.axis_index("k"),
    "unknown axis in tuple": lambda x: st.psum(x, ("i", "k")),
    "axes as list": lambda x: st.psum(x, ["i"]),
    "axes as frozenset": lambda x: st.all_gather(x, frozenset({"i"})),
    "repeated axes": lambda x: st.psum(x, ("i", "i")),
    "axis not a str": lambda x: st.psum(x, 0),
    "unknown pcast to": lambda x: st.pcast(x, "i", to="unreduce"),
    "axis_index_groups": lambda x: st.psum(x, "i", axis_index_groups=[[0, 1]]),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_an_spmd_error(mesh_ij: Any, name: str) -> None:
    with pytest.raises(st.SpmdTypeError) as info:
        trace(mesh_ij, BAD_INPUTS[name], (P("i"),))
    assert info.value.code.startswith("SPMD5"), str(info.value)
    if name.startswith("unknown axis"):
        assert info.value.code == "SPMD501"
        assert "'k'" in str(info.value)


def test_unknown_axis_in_spec_is_an_spmd_error(mesh_ij: Any) -> None:
    with pytest.raises(st.SpmdTypeError) as info:
        st.shard_map(lambda x: x, mesh=mesh_ij, in_specs=P("jj"), out_specs=P("jj"))
    assert info.value.code == "SPMD501"
    assert "did you mean 'j'?" in str(info.value)


def test_unknown_axis_in_axis_names_is_an_spmd_error(mesh_ij: Any) -> None:
    with pytest.raises(st.SpmdTypeError) as info:
        st.shard_map(lambda x: x, mesh=mesh_ij, in_specs=P(), out_specs=P(), axis_names={"ii"})
    assert info.value.code == "SPMD501"


def test_reduced_cast_of_python_scalar_is_not_a_bare_assertion(mesh_ij: Any) -> None:
    """JAX raises a bare AssertionError for pcast(2.0, 'i', to='reduced') (reference Q13)."""
    seen = {}

    def body(x: Any) -> None:
        seen["t"] = st.typeof(st.pcast(2.0, "i", to="reduced"))

    trace(mesh_ij, body)
    assert seen["t"] == st.SpmdType(reduced={"i"})


def test_partial_manual_unknown_axis_never_bare(mesh_ij: Any) -> None:
    with pytest.raises(st.SpmdTypeError) as info:
        trace(mesh_ij, lambda x: st.pcast(x, "j", to="varying"), (P("i"),), axis_names={"i"})
    assert info.value.code == "SPMD503"


def test_messages_never_mention_jax_internals(mesh_ij: Any) -> None:
    """The seed error's message is spmdtyped's, not JAX's `pvary cannot accept...`."""
    def body(x: Any) -> None:
        st.psum(st.pcast(x, "i", to="reduced"), "i")

    with pytest.raises(st.SpmdTypeError) as info:
        trace(mesh_ij, body)
    assert not re.search(r"pvary cannot accept|jax/_src|Traceback", str(info.value))
    assert info.value.__cause__ is None or not isinstance(info.value.__cause__, AssertionError)



PARTIAL_MANUAL_UR = {
    "pcast reduced then mul": lambda x: (lambda r: r * r)(st.pcast(x, "i", to="reduced")),
    "pcast unreduced then add": lambda x: (lambda u: u + u)(
        st.pcast(st.pvary(x, "i"), "i", to="unreduced")),
    "all_gather reduced then mul": lambda x: st.all_gather(st.pvary(x, "i"), "i",
                                                           to="reduced") * 2.0,
}


@pytest.mark.parametrize("name", sorted(PARTIAL_MANUAL_UR))
def test_partial_manual_unreduced_reduced_is_an_spmd_error(mesh_ij: Any, name: str) -> None:
    """JAX raises a bare AssertionError on every op on a U/R value in a partial-manual
    shard_map (reference Q15); spmdtyped refuses to make one (SPMD403)."""
    def raw_body(x: Any) -> Any:
        conv = {"reduced": "reduced", "unreduced": "unreduced"}
        if "unreduced" in name:
            u = jax.lax.pcast(jax.lax.pcast(x, "i", to="varying"), "i", to=conv["unreduced"])
            _ = u + u
        elif "all_gather" in name:
            _ = jax.lax.all_gather(jax.lax.pcast(x, "i", to="varying"), "i", to="reduced") * 2.0
        else:
            r = jax.lax.pcast(x, "i", to="reduced")
            _ = r * r
        return jnp.zeros(())

    f = jax.shard_map(raw_body, mesh=mesh_ij, in_specs=P(), out_specs=P(), axis_names={"i"})
    with pytest.raises(AssertionError):   # the oracle: JAX's own bare assertion
        jax.jit(f).trace(local_sds(mesh_ij, P(), (8, 8)))
    expect("SPMD403", lambda: trace(mesh_ij, PARTIAL_MANUAL_UR[name], axis_names={"i"}),
           fragments=("full-manual",))


def test_partial_manual_reduced_in_spec_is_an_spmd_error(mesh_ij: Any) -> None:
    expect("SPMD403", lambda: st.shard_map(lambda x: x, mesh=mesh_ij, in_specs=P(reduced={"i"}),
                                           out_specs=P(reduced={"i"}), axis_names={"i"}),
           fragments=("full-manual", "reduced"))


def _first_violation(rep: Any) -> None:
    if rep.violations:
        raise rep.violations[0]


def test_spmd407_vmap_grad_of_an_invariant_parameter(mesh_dp_tp: Any) -> None:
    def body(w: Any, xb: Any) -> Any:
        def net(p: Any, x: Any) -> Any:
            return st.numpy.sin((p * x).sum())
        return jax.vmap(st.grad(net), in_axes=(None, 0))(w, xb)

    f = st.shard_map(body, mesh=mesh_dp_tp, in_specs=(P(), P("dp")), out_specs=P("dp"))
    args = (local_sds(mesh_dp_tp, P(), (8,)), local_sds(mesh_dp_tp, P("dp"), (4, 8)))
    expect("SPMD407", lambda: jax.jit(f).trace(*args), axes=("dp",),
           fix=("pcast(params, 'dp', to='varying')",))


def test_spmd303_infer_raw_cond_on_a_varying_predicate(mesh_dp_tp: Any) -> None:
    def f(x: Any) -> Any:
        y = jax.lax.cond(jax.lax.axis_index("tp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)
        return y[None]

    rep = st.adapters.infer(f, jnp.float32(2.0), mesh=mesh_dp_tp, in_specs=P(), out_specs=P("tp"))
    e = expect("SPMD303", lambda: _first_violation(rep), axes=("tp",),
               fix=("pcast(x, 'tp', to='varying')",))
    assert e.line == f.__code__.co_firstlineno + 1  # type: ignore[attr-defined]


def test_spmd408_infer_callback_drops_a_varying_axis(mesh_dp_tp: Any) -> None:
    def f(g: Any, x: Any) -> Any:
        y = jax.pure_callback(np.matmul, jax.ShapeDtypeStruct(x.shape[:1], x.dtype), x, g,
                              vmap_method="sequential")
        return (y * y).sum()

    rep = st.adapters.infer(f, jnp.ones(8), jnp.ones((8, 8)), mesh=mesh_dp_tp,
                            in_specs=(P(), P("dp")), out_specs=P())
    e = expect("SPMD408", lambda: _first_violation(rep), axes=("dp",), fragments=("st.opaque",))
    assert e.line == f.__code__.co_firstlineno + 1  # type: ignore[attr-defined]


def test_every_registered_code_is_tested() -> None:
    """Every code of the registry is the expected code of an `expect(...)` call in a test of
    this file (each such test fails unless the call raises that code). Read from this file's
    source, so it holds whichever tests ran before it, in any order, with -k/-m or alone."""
    tree = ast.parse(Path(__file__).read_text())
    tested = {call.args[0].value
              for fn in tree.body if isinstance(fn, ast.FunctionDef) and fn.name.startswith("test_")
              for call in ast.walk(fn)
              if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
              and call.func.id == "expect" and call.args and isinstance(call.args[0], ast.Constant)}
    missing = sorted(set(_errors.REGISTRY) - tested)
    assert not missing, f"codes without a triggering test: {missing}"
    assert not tested - set(_errors.REGISTRY), f"unregistered codes: {sorted(tested - set(_errors.REGISTRY))}"


# ------------------------------------------------------------------------------- SPMD7xx


def test_spmd7xx_report_flags_raised_by_check() -> None:
    """The communication report's flags (`st.report(...).check()` raises the first one);
    each program and its fixed twin are in `_report_programs.py`, more in test_report.py."""
    import _report_programs as rp

    def check(made: Any) -> Any:
        return lambda: st.report(made[0], *made[1]).check()

    expect("SPMD701", check(rp.accumulation("per_micro")), axes=("dp",),
           fragments=("4 iterations",), fix=("st.psum(acc, 'dp')",))
    expect("SPMD702", check(rp.flagged("SPMD702")), axes=("dp",), fragments=("Invariant",))
    expect("SPMD703", check(rp.flagged("SPMD703")), axes=("dp",), fragments=("pure_callback",))
    expect("SPMD704", check(rp.flagged("SPMD704")), axes=("dp",), fix=("psum_scatter",))
    step, args = rp.accumulation("implicit")
    rep = st.report(step, *args)
    rep.flags = rep.flags[1:]   # the second flag of the same program
    expect("SPMD705", rep.check, axes=("dp",), fragments=("4.00x the ideal",))


# ------------------------------------------------------------ every error names its line

def test_an_error_of_the_rules_called_directly_names_no_line() -> None:
    """`file`, `line` and `source` are attributes of every SpmdTypeError (None where nothing
    located it): a user's `except st.SpmdTypeError as e: e.file` never fails."""
    with pytest.raises(st.SpmdTypeError) as e:
        st.SpmdType(varying=(1,))  # type: ignore[arg-type]
    assert (e.value.file, e.value.line, e.value.source) == (None, None, None)


@pytest.mark.parametrize("face", ["st.shard_map", "typed_shard_map", "checking"])
def test_an_argument_against_its_in_spec_names_the_users_call(face: str) -> None:
    """JAX's rejection of an in_spec (an argument not placed as an Explicit mesh's spec says)
    is raised before the body traces, from inside the face and JAX: SPMD403 at the user's
    line that called the program, through `jax.jit` too (`checking(step)` raised JAX's
    ValueError as it was)."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    smap = {"st.shard_map": st.shard_map, "typed_shard_map": st.adapters.typed_shard_map,
            "checking": jax.shard_map}[face]
    program = smap(lambda x: x * 2, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))
    calls = (program, jax.jit(program))
    if face == "checking":
        calls = tuple(st.adapters.checking(c) for c in calls)
    for call in calls:
        with pytest.raises(st.SpmdTypeError) as e:
            call(jnp.ones((4, 3)))  # the call's line
        assert e.value.code == "SPMD403", str(e.value)
        with open(__file__) as f:
            line = next(n for n, text in enumerate(f, 1) if text.rstrip().endswith("# the call's line"))
        assert (e.value.file, e.value.line) == (__file__, line)
        assert e.value.source == f"{__file__}:{line}"

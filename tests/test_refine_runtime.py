"""The runtime refinement (Shard / Partial / Rep): every Python form of the surface table
computes its result's refinement through the rule its row names, shard_map inputs are refined
by their in_specs, collectives by their parameters, and the hints `st.Shard`, `st.Partial`,
`st.Rep` check a value's refinement with isinstance and beartype.

Each test traces a body on the (dp: 2, tp: 4) mesh (nothing is compiled) and records
`_array.refinement_of(...)` of the values it builds.
"""

from __future__ import annotations

from typing import Any, Literal

import jax
import jax.numpy as jnp
import pytest
from _helpers import trace
from beartype import beartype
from beartype.roar import BeartypeCallHintParamViolation
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _surface
from spmdtyped._rules import refine as rf
from spmdtyped._typed import array as _array
from spmdtyped._typed import refining as _refining

snp = st.numpy
PARTIAL, REP, INDEX, ONEHOT = rf.PARTIAL, rf.REP, rf.INDEX, rf.ONEHOT


def S(d: int) -> rf.Shard:
    return rf.Shard(d)


def kinds(x: Any) -> dict[str, Any]:
    return _array.refinement_of(x).as_dict()


def run(mesh: Any, body: Any, specs: tuple[P, ...], local: tuple[int, ...] = (4, 8)) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    trace(mesh, lambda *a: body(seen, *a), specs, local=local)
    return seen


# ---------------------------------------------------------------------------- the table


def test_every_row_names_a_kind_the_runtime_dispatches() -> None:
    for row in _surface.ROWS:
        assert row.refine in _surface.REFINE_KINDS, row
        assert row.refine == "collective" or row.refine in _refining.REFINERS, row
    assert set(_refining.REFINERS) == set(_surface.REFINE_KINDS) - {"collective"}
    # a few rows, as the design note reads them
    assert _surface.by_dunder("__matmul__").refine == "matmul"
    assert _surface.by_function("numpy", "sum").refine == "reduction"
    assert _surface.by_function("nn", "softmax").refine == "softmax"
    assert _surface.by_function("numpy", "zeros_like").refine == "constructor"
    assert _surface.by_attribute("T").refine == "transpose"


# ---------------------------------------------------------------------------- sources


def test_in_specs_make_shards_and_every_input_carries_data(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any, w: Any, b: Any, both: Any) -> None:
        seen.update(x=kinds(x), w=kinds(w), b=_array.refinement_of(b), both=kinds(both))

    seen = run(mesh_dp_tp, body, (P("dp", "tp"), P(None, "tp"), P(), P(("dp", "tp"))))
    assert seen["x"] == {"dp": S(-2), "tp": S(-1)}
    assert seen["w"] == {"tp": S(-1)}
    assert seen["b"] == rf.Refinement(data=True)
    assert seen["both"] == {"dp": S(-2), "tp": S(-2)}


def test_collectives_and_casts(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any, b: Any) -> None:
        seen["psum_scatter"] = kinds(st.psum_scatter(x.sum(0), "tp", scatter_dimension=0, tiled=True))
        seen["all_gather"] = kinds(st.all_gather(x, "tp", axis=1, tiled=True))
        seen["all_to_all"] = kinds(st.all_to_all(x, "tp", 0, 1, tiled=True))
        seen["ppermute"] = kinds(st.ppermute(x, "tp", [(i, (i + 1) % 4) for i in range(4)]))
        seen["pvary"] = kinds(st.pvary(b, "tp"))
        seen["pcast"] = kinds(st.pcast(b, "tp", to="varying"))
        seen["axis_index"] = kinds(st.axis_index("tp"))
        seen["owner"] = kinds(snp.where(st.axis_index("tp") == 0, b, 0.0))
        seen["psum"] = kinds(st.psum(x.sum(-1), "tp"))

    seen = run(mesh_dp_tp, body, (P(None, "tp"), P()), local=(8, 4))
    assert seen["psum_scatter"] == {"tp": S(-1)}
    assert seen["all_gather"] == {"tp": REP}
    assert seen["all_to_all"] == {"tp": S(-2)}
    assert seen["ppermute"] == {}
    assert seen["pvary"] == seen["pcast"] == {"tp": REP}
    assert seen["axis_index"] == {"tp": INDEX}
    assert seen["owner"] == {"tp": PARTIAL}      # where(axis_index(a) == c, x, 0)
    assert seen["psum"] == {}


# ---------------------------------------------------------------------------- each form


def test_operators_methods_and_properties(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any, w: Any, b: Any) -> None:
        h = x @ w                                 # [8, 8] @ [8, 8]: contracts the tp shard
        seen["@"] = kinds(h)
        seen["-x"] = kinds(-x)
        seen["x * 2"] = kinds(x * 2.0)
        seen["x.sum(-1)"] = kinds(x.sum(-1))
        seen["x.sum(0)"] = kinds(x.sum(0))
        seen["x.max(-1)"] = kinds(x.max(-1))
        seen["x.mean(-1, keepdims)"] = kinds(x.mean(-1, keepdims=True))
        seen["x.T"] = kinds(x.T)
        seen["x.transpose(1, 0)"] = kinds(x.transpose(1, 0))
        seen["x.reshape"] = kinds(x.reshape(2, 4, 8))
        seen["x.astype"] = kinds(x.astype(jnp.bfloat16))
        seen["h / b"] = kinds(h / b[0, 0])

    seen = run(mesh_dp_tp, body, (P(None, "tp"), P("tp", None), P()), local=(8, 8))
    assert seen["@"] == {"tp": PARTIAL}
    assert seen["-x"] == seen["x * 2"] == seen["x.astype"] == {"tp": S(-1)}
    assert seen["x.sum(-1)"] == {"tp": PARTIAL}
    assert seen["x.sum(0)"] == {"tp": S(-1)}
    assert seen["x.max(-1)"] == {}
    assert seen["x.mean(-1, keepdims)"] == {"tp": PARTIAL}
    assert seen["x.T"] == seen["x.transpose(1, 0)"] == {"tp": S(-2)}
    assert seen["x.reshape"] == {"tp": S(-1)}
    assert seen["h / b"] == {"tp": PARTIAL}      # scaled by a replicated factor


def test_indexing_and_at(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any) -> None:
        seen["x[0]"] = kinds(x[0])
        seen["x[:, 0]"] = kinds(x[:, 0])
        seen["x[:2]"] = kinds(x[:2])
        seen["x[None]"] = kinds(x[None])
        seen["x[..., :]"] = kinds(x[..., :])
        seen["x[traced]"] = kinds(x[st.axis_index("tp")])
        seen["at set literal"] = kinds(x.at[0].set(0.0))
        p = x.sum(-1)
        seen["p[traced uniform]"] = kinds(p[jnp.int32(1)])

    seen = run(mesh_dp_tp, body, (P("tp", None),), local=(4, 8))
    assert seen["x[0]"] == {}                          # a constant index into the shard
    assert seen["x[:, 0]"] == {"tp": S(-1)}
    assert seen["x[:2]"] == {}                         # a partial slice of the shard
    assert seen["x[None]"] == {"tp": S(-2)}
    assert seen["x[..., :]"] == {"tp": S(-2)}
    assert seen["x[traced]"] == {}
    assert seen["at set literal"] == {"tp": S(-2)}
    assert seen["p[traced uniform]"] == {}             # x.sum(-1) keeps rows: a Shard, then cut


def test_numpy_functions(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any, y: Any) -> None:
        seen["sum axis=-1"] = kinds(snp.sum(x, axis=-1))
        seen["mean"] = kinds(snp.mean(x, axis=-1))
        seen["cumsum -1"] = kinds(snp.cumsum(x, axis=-1))
        seen["cumsum 0"] = kinds(snp.cumsum(x, axis=0))
        seen["sort"] = kinds(snp.sort(x))                          # axis=-1 by default
        seen["flip 0"] = kinds(snp.flip(x, 0))
        seen["roll"] = kinds(snp.roll(x, 1, axis=0))
        seen["take 0"] = kinds(snp.take(x, jnp.arange(2), axis=0))
        seen["swapaxes"] = kinds(snp.swapaxes(x, 0, 1))
        seen["moveaxis"] = kinds(snp.moveaxis(x[None], 0, -1))
        seen["expand_dims"] = kinds(snp.expand_dims(x, 0))
        seen["squeeze"] = kinds(snp.squeeze(x[None]))
        seen["broadcast_to"] = kinds(snp.broadcast_to(x, (3, 4, 2)))
        seen["concatenate 0"] = kinds(snp.concatenate([x, y], axis=0))
        seen["concatenate -1"] = kinds(snp.concatenate([x, y], axis=-1))
        seen["stack"] = kinds(snp.stack([x, y], axis=0))
        seen["einsum"] = kinds(snp.einsum("ij,kj->ik", x, y))
        seen["dot"] = kinds(snp.dot(x, y.T))
        seen["zeros_like"] = _array.refinement_of(snp.zeros_like(x))
        seen["ones"] = _array.refinement_of(snp.ones((4, 2)))

    seen = run(mesh_dp_tp, body, (P(None, "tp"), P(None, "tp")), local=(4, 2))
    assert seen["sum axis=-1"] == seen["mean"] == {"tp": PARTIAL}
    assert seen["cumsum -1"] == seen["sort"] == {}
    assert seen["cumsum 0"] == seen["flip 0"] == seen["roll"] == seen["take 0"] == {"tp": S(-1)}
    assert seen["swapaxes"] == {"tp": S(-2)}
    assert seen["moveaxis"] == {"tp": S(-2)}
    assert seen["expand_dims"] == seen["squeeze"] == seen["broadcast_to"] == {"tp": S(-1)}
    assert seen["concatenate 0"] == seen["stack"] == {"tp": S(-1)}
    assert seen["concatenate -1"] == {}
    assert seen["einsum"] == seen["dot"] == {"tp": PARTIAL}
    assert seen["zeros_like"] == seen["ones"] == rf.NONE


def test_softmax_over_a_shard_dim_is_rejected_elsewhere_kept(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any) -> None:
        seen["softmax rows"] = kinds(st.nn.softmax(x, axis=-1))
        seen["logsumexp rows"] = kinds(st.nn.logsumexp(x, axis=-1))
        seen["relu"] = kinds(st.nn.relu(x))

    seen = run(mesh_dp_tp, body, (P("tp", None),))
    assert seen["softmax rows"] == seen["relu"] == {"tp": S(-2)}
    assert seen["logsumexp rows"] == {"tp": S(-1)}
    for fn in (st.nn.softmax, st.nn.log_softmax, st.nn.logsumexp):
        with pytest.raises(st.CombineError, match="SPMD211"):
            trace(mesh_dp_tp, lambda z, fn=fn: fn(z, axis=-1), (P(None, "tp"),), local=(4, 8))


def test_an_allowed_code_makes_the_axis_plain(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], h: Any, w: Any, b: Any) -> None:
        with st.allow("SPMD210"):
            seen["y"] = kinds(h @ w + b[0])

    assert run(mesh_dp_tp, body, (P(None, "tp"), P("tp", None), P()), local=(4, 4))["y"] == {}


# ---------------------------------------------------------------------------- hints


def test_hint_classes_and_spellings() -> None:
    assert st.Shard["tp", -1] is st.Shard["tp", Literal[-1]]
    assert st.Typed[st.Shard["dp", 0], st.Partial["tp"]] is st.Typed[st.Partial["tp"], st.Shard["dp", 0]]
    assert st.Partial["dp", "tp"] is st.Typed[st.Partial["dp"], st.Partial["tp"]]
    assert repr(st.Shard["tp", -1]) == "<class 'spmdtyped.Shard['tp', -1]'>"
    with pytest.raises(st.UsageError, match="SPMD504"):
        st.Shard["tp"]
    with pytest.raises(st.UsageError, match="the dim must be an int"):
        st.Shard["tp", "last"]
    with pytest.raises(st.UsageError, match="named twice"):
        st.Rep["tp", "tp"]


def test_isinstance_checks_the_refinement_per_value(mesh_dp_tp: Any) -> None:
    def body(seen: dict[str, Any], x: Any, b: Any) -> None:
        p = x.sum(-1)
        seen.update({
            "shard from the left": isinstance(x, st.Shard["tp", 1]),
            "shard from the right": isinstance(x, st.Shard["tp", -1]),
            "other dim": isinstance(x, st.Shard["tp", 0]),
            "partial": isinstance(p, st.Partial["tp"]),
            "partial is not a shard": isinstance(p, st.Shard["tp", -1]),
            "plain accepted": isinstance(st.ppermute(x, "tp", [(0, 1), (1, 0), (2, 3), (3, 2)]),
                                         st.Shard["tp", -1]),
            "invariant refused": isinstance(b, st.Partial["tp"]),
            "rep": isinstance(st.pvary(b, "tp"), st.Rep["tp"]),
            "four-state still": isinstance(x, st.Varying["tp"]),
            "why": st.Shard["tp", 0].__instancecheck_str__(x),
            "why invariant": st.Partial["tp"].__instancecheck_str__(b),
            "repr": repr(p),
        })

    seen = run(mesh_dp_tp, body, (P(None, "tp"), P()))
    assert seen["shard from the left"] and seen["shard from the right"] and seen["partial"]
    assert seen["plain accepted"] and seen["rep"] and seen["four-state still"]
    assert not seen["other dim"] and not seen["partial is not a shard"]
    assert not seen["invariant refused"]
    assert seen["why"] == "this value is Shard(-1) over 'tp', but the hint wants Shard(-2)"
    assert seen["why invariant"] == "this value is not varying over 'tp', but the hint wants Partial"
    assert seen["repr"].startswith("Partial['tp'](")


def test_beartype_checks_refined_hints(mesh_dp_tp: Any) -> None:
    @beartype
    def row_parallel(h: st.Shard["tp", -1], w: st.Shard["tp", 0]) -> st.Partial["tp"]:
        return h @ w

    trace(mesh_dp_tp, row_parallel, (P(None, "tp"), P("tp", None)), local=(4, 4))
    with pytest.raises(BeartypeCallHintParamViolation, match="Shard"):
        trace(mesh_dp_tp, lambda h, w: row_parallel(w, h), (P(None, "tp"), P("tp", None)),
              local=(4, 4))


# ------------------------------------------------------- the pre-divided row-parallel bias (F1)


def _row_parallel(body: Any) -> Any:
    import jax
    import numpy as np

    h = jax.random.normal(jax.random.key(300), (4, 16), dtype=jnp.float32)
    w2 = jax.random.normal(jax.random.key(301), (16, 8), dtype=jnp.float32)
    b = jax.random.normal(jax.random.key(302), (8,), dtype=jnp.float32)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    f = jax.jit(st.shard_map(body, mesh=mesh, in_specs=(P("dp", "tp"), P("tp", None), P()),
                             out_specs=P("dp", None)))
    return np.asarray(f(h, w2, b)), np.asarray(h @ w2 + b)


def test_row_parallel_bias_before_the_reduction_is_rejected() -> None:
    """FastDeploy-style row-parallel layer, buggy: the bias is added on every device before
    the psum (counted 4 times)."""
    with pytest.raises(st.CombineError) as e:
        _row_parallel(lambda h, w2, b: st.psum(h @ w2 + b, "tp"))
    assert e.value.code == "SPMD210" and "st.axis_size('tp')" in str(e.value)
    # divided by another axis's size, or scaled again after the division: still a bias
    for bad in (lambda h, w2, b: st.psum(h @ w2 + b / st.axis_size("dp"), "tp"),
                lambda h, w2, b: st.psum(h @ w2 + (b / st.axis_size("tp")) * 2.0, "tp"),
                lambda h, w2, b: st.psum(h @ w2 + b / 4, "tp")):   # a literal is not the size
        with pytest.raises(st.CombineError):
            _row_parallel(bad)


@pytest.mark.parametrize("form", ["b / n", "b * (1 / n)", "(1 / n) * b", "pvary(b) / n - (-)"])
def test_row_parallel_bias_pre_divided_by_the_axis_size_is_right(form: str) -> None:
    """Fixed: `b / st.axis_size("tp")` is this device's share of the bias, a Partial term; the
    psum counts it once. The numbers are the single-device `h @ w2 + b`."""
    import numpy as np

    seen: dict[str, Any] = {}

    def body(h: Any, w2: Any, b: Any) -> Any:
        n = st.axis_size("tp")
        if form == "b / n":
            y = h @ w2 + b / n
        elif form == "b * (1 / n)":
            y = h @ w2 + b * (1 / n)
        elif form == "(1 / n) * b":
            y = (1 / n) * b + h @ w2
        else:
            y = h @ w2 - (-st.pvary(b, "tp")) / n
        seen["y"] = kinds(y)
        return st.psum(y, "tp")

    got, want = _row_parallel(body)
    assert seen["y"].get("tp") is PARTIAL
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------- what the narrowed SPMD108 / SPMD215 accept


def test_psum_of_a_sharded_input_is_accepted_and_of_a_shard_gradient_rejected(mesh_dp_tp: Any) -> None:
    """A value sharded by its in_spec may be a stack of per-device terms: its psum is right.
    The gradient of a Shard parameter summed over its own axis is SPMD108 (expert gradients
    over the expert axis), also after ops (the gradient flag flows)."""
    seen: dict[str, Any] = {}

    def body(x: Any, w: Any, wrong: bool = False) -> None:
        seen["stack"] = st.typeof(st.psum(x, "dp"))
        g = st.grad(lambda v: snp.sum(st.pcast(v, "dp", to="varying") * 2.0))(w)
        seen["g"] = _array.refinement_of(g)
        seen["g_type"] = st.typeof(g)                 # the dp copies already summed by JAX
        if wrong:
            st.psum(g * 2.0, "tp")                    # still the gradient, still Shard(tp)

    trace(mesh_dp_tp, body, (P("dp"), P("tp")))
    assert seen["stack"] == st.SpmdType()
    assert seen["g"].grad and seen["g"].get("tp") == S(-2)
    assert seen["g_type"] == st.SpmdType(varying="tp")
    # (a trace of its own: an error caught inside the body would leave its equation in the
    # program, which the engine reports again when the body returns, docs/runtime.md)
    with pytest.raises(st.AxisStateError) as e:
        trace(mesh_dp_tp, lambda x, w: body(x, w, wrong=True), (P("dp"), P("tp")))
    assert e.value.code == "SPMD108"


def test_reductions_across_devices_laid_along_their_shard_are_not_spmd215(mesh_dp_tp: Any) -> None:
    """`x - st.pmax(x, "tp")` (and psum/pmean, and values computed only from them) combines each
    position with its own reduction over the devices; an Invariant input laid along the same
    Shard dim is SPMD215; concatenating along the Shard dim appends, nothing is laid along it."""
    seen: dict[str, Any] = {}

    def body(x: Any, b: Any) -> None:
        m = st.pmax(x, "tp")
        seen["shift"] = kinds(x - m)
        seen["scaled"] = kinds(x / (st.psum(x, "tp") ** 2 + 1.0))
        seen["cat"] = kinds(snp.concatenate([x, b], axis=0))

    trace(mesh_dp_tp, body, (P("tp"), P()), local=(4, 8))
    assert seen["shift"] == {"tp": S(-2)} and seen["scaled"] == {"tp": S(-2)}
    assert seen["cat"] == {}
    # each in a trace of its own (see the test above)
    with pytest.raises(st.CombineError) as e:
        trace(mesh_dp_tp, lambda x, b: x * b, (P("tp"), P()), local=(4, 8))
    assert e.value.code == "SPMD215"
    with pytest.raises(st.CombineError):                # mixed with an input: still laid along
        trace(mesh_dp_tp, lambda x, b: x * (b + st.pmax(x, "tp")), (P("tp"), P()), local=(4, 8))


def test_call_params_binds_as_inspect_does():
    """`_refining.call_params` binds a call's arguments without building `inspect`'s objects
    where the signature is plain; on every JAX function and spelling below it gives what
    `Signature.bind(...).apply_defaults()` gives, and {} where that raises."""
    import inspect

    def by_inspect(fn, first, args, kwargs):
        try:
            bound = inspect.signature(fn).bind(first, *args, **kwargs)
        except TypeError:
            return {}
        bound.apply_defaults()
        return dict(bound.arguments)

    x = jnp.ones((2, 3))
    calls = [
        (jnp.sum, (), {}), (jnp.sum, (0,), {}), (jnp.sum, (), {"axis": 1, "keepdims": True}),
        (jnp.sum, (0,), {"axis": 1}), (jnp.sum, (), {"bogus": 1}),
        (jnp.sum, (0, None, None, True), {}),
        (jnp.roll, (1,), {"axis": 0}), (jnp.roll, (), {}), (jnp.moveaxis, (0, 1), {}),
        (jnp.swapaxes, (0,), {"axis2": 1}), (jnp.mean, (), {"where": None}),
        (jnp.cumsum, (1,), {}), (jnp.transpose, ((1, 0),), {}), (jnp.reshape, ((3, 2),), {}),
        (jax.nn.softmax, (), {"axis": 0}), (jax.nn.one_hot, (4,), {}),
        (jnp.argmax, (), {"axis": -1, "keepdims": False}), (jnp.take, (jnp.arange(2),), {"axis": 1}),
    ]
    for fn, args, kwargs in calls:
        assert _refining.call_params(fn, x, args, kwargs) == by_inspect(fn, x, args, kwargs), fn

"""Core runtime: hints, typed values, collectives, the shard_map boundary, check mode, opt-outs."""

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import REPLICATED, put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying, _rules
from spmdtyped._typed import hints as _hints

# ----------------------------------------------------------------------------- hints

def test_hint_classes_are_cached_and_canonical():
    assert Varying["i"] is Varying["i"]
    assert Varying["i"] is Varying[Literal["i"]]
    assert Varying["i", "j"] is Varying["j", "i"] is Varying["i | j"]
    assert Typed[Varying["i"]] is Varying["i"]
    assert Typed[Varying["j"], Reduced["i"]] is Typed[Reduced["i"], Varying["j"]]
    assert Varying["j", Reduced["i"]] is Typed[Varying["j"], Reduced["i"]]
    assert Invariant._spmd_type == st.SpmdType()
    assert Typed[Varying["j"], Reduced["i"]].__qualname__ == "Typed[Varying['j'], Reduced['i']]"
    assert Unreduced["i"].__module__ == "spmdtyped"


def test_sarray_canonical_form():
    from typing import Never

    cls = st.SArray[Literal["j"], Never, Literal["i"]]
    assert cls is Typed[Varying["j"], Reduced["i"]]


def test_spmdtype_basics():
    t = st.SpmdType(varying={"j"}, reduced={"i"})
    assert t.state("i") is st.State.REDUCED and t.state("j") is st.State.VARYING
    assert t.state("k") is st.State.INVARIANT
    assert str(t) == "Typed[Varying['j'], Reduced['i']]"
    assert t.jax_str(("i", "j")) == "{V:j, R:i}"
    assert st.SpmdType(unreduced="i").unreduced_kind == "sum"
    assert _rules.cotangent(t) == st.SpmdType(varying={"j"}, unreduced={"i"})


def test_isinstance_covariance():
    x = st.SpmdType()
    assert _rules.INVARIANT == x
    from spmdtyped._typed.hints import _accepts

    assert _accepts(st.SpmdType(varying={"i"}), st.SpmdType())          # Invariant <: Varying
    assert _accepts(st.SpmdType(varying={"i", "j"}), st.SpmdType(varying={"i"}))
    assert not _accepts(st.SpmdType(varying={"i"}), st.SpmdType(varying={"j"}))
    assert not _accepts(st.SpmdType(reduced={"i"}), st.SpmdType())      # R is exact
    assert not _accepts(st.SpmdType(), st.SpmdType(unreduced={"i"}))


# ----------------------------------------------------------------------------- boundary

@pytest.mark.parametrize("spec, expected", [
    (P(), st.SpmdType()),
    (P("i"), st.SpmdType(varying={"i"})),
    (P(("i", "j")), st.SpmdType(varying={"i", "j"})),
    (P("i", "j"), st.SpmdType(varying={"i", "j"})),
    (P(None, "j"), st.SpmdType(varying={"j"})),
])
def test_in_specs_give_states(mesh_ij, spec, expected):
    seen = {}

    @st.shard_map(mesh=mesh_ij, in_specs=spec, out_specs=spec)
    def f(x):
        seen["t"] = st.typeof(x)
        seen["cls"] = type(x)
        assert isinstance(x, seen["cls"])
        return x

    x = put(mesh_ij, jnp.arange(64.0).reshape(8, 8), spec)
    out = f(x)
    assert seen["t"] == expected
    assert seen["cls"] is _hints.state_class(expected)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))


def test_typeof_raw_matches_jax(mesh_ij):
    def f(x):
        y = jax.lax.psum(x, "j")
        t = st.typeof(y)
        mat = jax.typeof(y).manual_axis_type
        assert t == st.SpmdType(mat.varying, mat.unreduced, mat.reduced)
        assert isinstance(y, Varying["i"]) and not isinstance(y, Invariant)
        assert isinstance(x, Varying["i", "j"])
        return y

    jax.jit(jax.shard_map(f, mesh=mesh_ij, in_specs=P("i", "j"), out_specs=P("i")))(
        put(mesh_ij, jnp.ones((8, 8)), P("i", "j")))


def test_out_spec_checked_before_jax(mesh_ij):
    @st.shard_map(mesh=mesh_ij, in_specs=P("i"), out_specs=P())
    def f(x):
        return x * 2

    with pytest.raises(st.BoundaryError) as ei:
        f(put(mesh_ij, jnp.ones(8), P("i")))
    e = ei.value
    assert e.code == "SPMD401" and e.axes == ("i",) and e.states == {"i": "varying"}
    assert "st.shard_map(f)" in str(e) and "psum" in e.fix


def test_return_hint_checked_on_the_value(mesh_dp_tp):
    """The value returned through the boundary fits the return hint (`_rules.check_return`,
    SPMD401, the rule the mypy plugin applies at a `return`), also where the out_spec would
    take it; a refined hint checks the refinement (a partial sum returned for `Rep`)."""
    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P("dp", None), P(None, "tp")), out_specs=P("dp", "tp"))
    def f(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp"]:
        return x @ w

    x, w = put(mesh_dp_tp, jnp.ones((4, 8)), P("dp", None)), put(mesh_dp_tp, jnp.ones((8, 8)), P(None, "tp"))
    with pytest.raises(st.BoundaryError) as ei:
        f(x, w)
    assert ei.value.code == "SPMD401" and ei.value.axes == ("tp",) and "psum" in ei.value.fix

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P("dp", None), P(None, "tp")), out_specs=P("dp", "tp"))
    def g(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp", "tp"]:
        return x @ w

    np.testing.assert_allclose(g(x, w), np.ones((4, 8)) @ np.ones((8, 8)))

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P(None, "tp"), P("tp", None)), out_specs=P("tp"))
    def h(a: Varying["tp"], b: Varying["tp"]) -> st.Rep["tp"]:
        return a @ b

    with pytest.raises(st.BoundaryError, match="Partial over 'tp', but the hint wants Rep"):
        h(put(mesh_dp_tp, jnp.ones((4, 8)), P(None, "tp")), put(mesh_dp_tp, jnp.ones((8, 8)), P("tp", None)))


def test_in_specs_refinement_is_the_plugins(mesh_dp_tp):
    """The refinement literal in_specs give plain `Varying` parameters (`refine_shape.from_spec`):
    tests/typing/pass_refine.py `mlp_from_specs` reveals the plugin's for the same program
    (`gelu(x @ w1)` is dp=S-2, tp=S-1)."""
    from spmdtyped._rules.refine import Shard

    seen = {}

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P("dp", None), P(None, "tp")), out_specs=P("dp", "tp"))
    def f(x: Varying["dp"], w1: Varying["tp"]) -> Varying["dp", "tp"]:
        h = st.nn.gelu(x @ w1)
        seen["h"] = h.refinement
        return h

    f(put(mesh_dp_tp, jnp.ones((4, 8)), P("dp", None)), put(mesh_dp_tp, jnp.ones((8, 8)), P(None, "tp")))
    assert seen["h"].as_dict() == {"dp": Shard(-2), "tp": Shard(-1)}


def test_unreduced_output_needs_unreduced_spec(mesh_ij):
    @st.shard_map(mesh=mesh_ij, in_specs=P("i"), out_specs=P("i"))
    def f(x):
        return st.pcast(x, "i", to="unreduced")

    with pytest.raises(st.BoundaryError, match="wants Varying or Invariant"):
        f(put(mesh_ij, jnp.ones(8), P("i")))


def test_nested_pytrees_and_decorator(mesh_ij):
    @st.shard_map(mesh=mesh_ij, in_specs=({"a": P("i"), "b": P()},), out_specs={"s": P(), "v": P("i")})
    def f(tree):
        a, b = tree["a"], tree["b"]
        assert st.typeof(b) == st.SpmdType()
        return {"s": st.psum(a.sum(), "i") + b.sum(), "v": a * 2.0}

    tree = {"a": put(mesh_ij, jnp.arange(8.0), P("i")), "b": put(mesh_ij, jnp.ones(3))}
    out = jax.jit(f)(tree)
    assert float(out["s"]) == float(jnp.arange(8.0).sum() + 3)
    np.testing.assert_array_equal(np.asarray(out["v"]), np.arange(8.0) * 2)


def test_in_specs_structure_mismatch(mesh_ij):
    @st.shard_map(mesh=mesh_ij, in_specs=(P("i"),), out_specs=P())
    def f(x, y):
        return y

    with pytest.raises(st.BoundaryError) as ei:
        f(put(mesh_ij, jnp.ones(8), P("i")), put(mesh_ij, jnp.ones(8)))
    assert ei.value.code == "SPMD402"


def test_under_jit_grad_vmap(mesh_ij):
    @st.shard_map(mesh=mesh_ij, in_specs=(P("i"), P()), out_specs=P())
    def loss(x, w):
        return st.psum((x * w).sum(), "i")

    def raw_loss(x, w):
        return jax.shard_map(lambda x, w: jax.lax.psum((x * w).sum(), "i"), mesh=mesh_ij,
                             in_specs=(P("i"), P()), out_specs=P())(x, w)

    x = put(mesh_ij, jnp.arange(8.0), P("i"))
    w = put(mesh_ij, jnp.float32(3.0))
    assert float(jax.jit(loss)(x, w)) == float(jax.jit(raw_loss)(x, w))
    g = jax.jit(jax.grad(loss, argnums=1))(x, w)
    g_raw = jax.jit(jax.grad(raw_loss, argnums=1))(x, w)
    assert float(g) == float(g_raw) == float(jnp.arange(8.0).sum())
    ws = put(mesh_ij, jnp.arange(3.0))
    v = jax.vmap(loss, in_axes=(None, 0))(x, ws)
    v_raw = jax.vmap(raw_loss, in_axes=(None, 0))(x, ws)
    np.testing.assert_array_equal(np.asarray(v), np.asarray(v_raw))


def test_reduced_input_spec(mesh_ij):
    # A Reduced argument must already carry that sharding: produce it with an out_spec.
    make = jax.jit(jax.shard_map(lambda x: jax.lax.all_gather(x, "i", to="reduced", tiled=True),
                                 mesh=mesh_ij, in_specs=P("i"), out_specs=P(reduced={"i"})))
    r = make(put(mesh_ij, jnp.arange(8.0), P("i")))
    seen = {}

    @st.shard_map(mesh=mesh_ij, in_specs=(P(reduced={"i"}), P("i")), out_specs=P("i"))
    def f(w, x):
        seen["w"] = type(w)
        return w[:4] * x       # Reduced['i'] * Varying['i'] -> Varying['i'] (auto cast)

    # w[:4] lays the same replicated values on each device's slice of x: SPMD215 unless allowed
    with pytest.raises(st.CombineError, match="SPMD215"):
        jax.jit(f)(r, put(mesh_ij, jnp.ones(8), P("i")))
    with st.allow("SPMD215"):
        out = jax.jit(f)(r, put(mesh_ij, jnp.ones(8), P("i")))
    assert seen["w"] is Reduced["i"]
    np.testing.assert_array_equal(np.asarray(out), np.concatenate([np.arange(4.0)] * 2))


# ----------------------------------------------------------------------------- collectives

SPEC_IJ = P("i", "j")


def _run(mesh, body, spec=SPEC_IJ, out=REPLICATED, x=None):
    x = jnp.arange(64.0).reshape(8, 8) if x is None else x
    # these four-state tests reduce the input's blocks over the axes it is sharded on, as a
    # stack of per-device terms: SPMD108's opt-out (the refinement is tested on its own)
    with st.allow("SPMD108"):
        return jax.jit(st.shard_map(body, mesh=mesh, in_specs=spec, out_specs=out))(
            put(mesh, x, spec))


def test_collectives_result_states(mesh_ij):
    def body(x):
        assert type(st.psum(x, "j")) is Varying["i"]
        assert type(st.psum(x, ("i", "j"))) is Invariant
        assert type(st.ppermute(x, "i", [(0, 1), (1, 0)])) is Varying["i", "j"]
        assert type(st.all_gather(x, "j", tiled=True)) is Varying["i", "j"]
        assert type(st.all_gather(x, "j", to="invarying")) is Varying["i"]
        assert type(st.all_gather(x, "j", to="reduced")) is Typed[Varying["i"], Reduced["j"]]
        assert type(st.psum_scatter(x, "j", scatter_dimension=0, tiled=True)) is Varying["i", "j"]
        u = st.pcast(x, "j", to="unreduced")
        assert type(u) is Typed[Varying["i"], Unreduced["j"]]
        assert type(st.psum(u, "j")) is Varying["i"]
        assert type(st.psum_scatter(u, "j", scatter_dimension=0, tiled=True)) is Varying["i", "j"]
        assert type(st.axis_index("j")) is Varying["j"]
        assert st.axis_size(("i", "j")) == 8
        s = st.psum(x, ("i", "j"))
        assert type(st.pvary(s, "i")) is Varying["i"]
        assert type(st.pcast(s, "i", to="reduced")) is Reduced["i"]
        return st.psum(x, ("i", "j"))

    _run(mesh_ij, body)


def test_collectives_accept_raw_and_pytrees(mesh_ij):
    def body(x):
        out = st.psum({"a": x.raw, "b": (x, x.raw)}, "j")
        assert all(type(v) is Varying["i"] for v in jax.tree_util.tree_leaves(
            out, is_leaf=lambda v: isinstance(type(v), _hints._StateMeta)))
        return st.psum(out["a"], "i")

    _run(mesh_ij, body)


def test_typed_program_is_bit_identical_to_raw(mesh_ij):
    def typed(x):
        y = st.psum(x * 3.0 - 1.0, "j")
        z = st.ppermute(y, "i", [(0, 1), (1, 0)])
        return st.pmean(z @ z.T, "i")

    def raw(x):
        y = jax.lax.psum(x * 3.0 - 1.0, "j")
        z = jax.lax.ppermute(y, "i", [(0, 1), (1, 0)])
        return jax.lax.pmean(z @ z.T, "i")

    x = jax.random.normal(jax.random.key(1), (8, 8))
    a = _run(mesh_ij, typed, x=x)
    b = jax.jit(jax.shard_map(raw, mesh=mesh_ij, in_specs=P("i", "j"), out_specs=P()))(
        put(mesh_ij, x, P("i", "j")))
    assert np.array_equal(np.asarray(a), np.asarray(b))
    with st.allow("SPMD108"):
        lowered_typed = jax.jit(st.shard_map(typed, mesh=mesh_ij, in_specs=P("i", "j"),
                                             out_specs=P())).lower(
            put(mesh_ij, x, P("i", "j"))).as_text(debug_info=False)
    lowered_raw = jax.jit(jax.shard_map(raw, mesh=mesh_ij, in_specs=P("i", "j"), out_specs=P())).lower(
        put(mesh_ij, x, P("i", "j"))).as_text(debug_info=False)
    assert lowered_typed.replace("typed", "raw") == lowered_raw


# ----------------------------------------------------------------------------- strict + opt-out

def test_double_psum_rejected_and_allow(mesh_ij):
    def body(x):
        s = st.psum(x, "j")
        with pytest.raises(st.AxisStateError) as ei:
            st.psum(s, "j")
        assert ei.value.code == "SPMD103" and ei.value.states == {"j": "invariant"}
        with st.allow("SPMD103"):
            twice = st.psum(s, "j")          # JAX's behaviour: 4 * s
        assert type(twice) is Varying["i"]
        return st.psum(twice, "i")

    x = jnp.arange(64.0).reshape(8, 8)
    out = _run(mesh_ij, body, x=x, out=P(None, None))
    # per device: psum over j of its (4, 2) block, times 4, then psum over i
    blocks = x.reshape(2, 4, 4, 2).sum(axis=(0, 2))
    np.testing.assert_allclose(np.asarray(out), np.asarray(4 * blocks))


def test_allow_rejects_non_strict_codes():
    with pytest.raises(st.UsageError):
        with st.allow("SPMD101"):
            pass


def test_literal_cast_next_to_reduced(mesh_ij):
    def body(x):
        r = st.all_gather(x, "i", to="reduced", tiled=True)
        y = r * 2.0 + 1
        assert type(y) is Typed[Varying["j"], Reduced["i"]]
        u = st.pcast(x, "i", to="unreduced") / 2
        assert type(u) is Typed[Varying["j"], Unreduced["i"]]
        m = r.mean()
        assert type(m) is Reduced["i"] or type(m) is Typed[Varying["j"], Reduced["i"]]
        return st.psum(u, "i")

    x = jnp.arange(64.0).reshape(8, 8)
    out = _run(mesh_ij, body, spec=P("i", "j"), out=P(None, "j"), x=x)
    expected = (x[:4] + x[4:]) / 2
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected))


def test_check_mode_catches_a_wrong_table(mesh_ij, monkeypatch):
    wrong = _rules.AxisOp("psum", {_rules.V: _rules.V})
    monkeypatch.setitem(_rules.AXIS_OPS, "psum", wrong)

    def body(x):
        with pytest.raises(st.InternalConsistencyError) as ei:
            st.psum(x, "j")
        assert ei.value.code == "SPMD901" and "st.psum" in str(ei.value)
        with st.check_mode(False):
            st.psum(x, "j")
        return jax.lax.psum(x.raw, ("i", "j"))

    _run(mesh_ij, body)


def test_explain_every_code():
    from spmdtyped._errors import REGISTRY

    for code, entry in REGISTRY.items():
        page = st.explain(code)
        for section in ("## What it means", "## Solutions", "## Example fix", "## When it happens"):
            assert section in page, (code, section)
        assert entry.mypy_code.startswith("spmd-")
    with pytest.raises(st.UsageError):
        st.explain("SPMD999")


def test_cli_explain(capsys):
    from spmdtyped.__main__ import main

    assert main(["explain", "SPMD101"]) == 0
    assert "reduced" in capsys.readouterr().out.lower()
    assert main(["explain", "nope"]) == 2


def test_check_vma_false_tracks_states_itself(mesh_ij):
    seen = {}

    def typed(x, w):
        seen["x"] = type(x)
        u = st.pcast(x @ w, "j", to="unreduced")
        seen["u"] = type(u)
        r = st.all_gather(x, "j", to="reduced", tiled=True, axis=1)
        seen["r"] = type(r)
        with pytest.raises(st.AxisStateError) as ei:
            st.psum(r, "j")
        seen["code"] = ei.value.code
        return st.psum(u, "j")

    def raw(x, w):
        return jax.lax.psum(x @ w, "j")

    args = (put(mesh_ij, jnp.arange(64.0).reshape(8, 8), P("i", "j")),
            put(mesh_ij, jnp.ones((8, 3)), P("j")))
    specs = (P("i", "j"), P("j"))
    out = jax.jit(st.shard_map(typed, mesh=mesh_ij, in_specs=specs, out_specs=P("i"),
                               check_vma=False))(*args)
    ref = jax.jit(jax.shard_map(raw, mesh=mesh_ij, in_specs=specs, out_specs=P("i"),
                                check_vma=False))(*args)
    assert np.array_equal(np.asarray(out), np.asarray(ref))
    assert seen["x"] is Varying["i", "j"]
    assert seen["u"] is Typed[Varying["i"], Unreduced["j"]]
    assert seen["r"] is Typed[Varying["i"], Reduced["j"]]
    assert seen["code"] == "SPMD101"

    @st.shard_map(mesh=mesh_ij, in_specs=specs, out_specs=P(), check_vma=False)
    def forgot_psum(x, w):
        return x @ w

    with pytest.raises(st.BoundaryError):
        forgot_psum(*args)


def test_readme_strict_and_loose_tables_match_the_rule_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    for code, what, jax_does in _rules.STRICTER_THAN_JAX:
        assert f"| {code} | {what} | {jax_does} |" in readme, code
    for what, how in _rules.LOOSER_THAN_JAX:
        assert f"| {what} | {how} |" in readme, what

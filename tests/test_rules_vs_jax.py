"""Rule edge cases checked against JAX (the oracle): Reduced/Unreduced operands of scalars,
comparisons, `where`, `reciprocal`, `var`/`std`, `%`/`//`, dynamic indexing, `pvary` (cases the
differential tests once disagreed on).

Each test runs the JAX program next to the spmdtyped one, so it keeps checking the claim on
both JAX legs rather than freezing spmdtyped's current answer.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _helpers import REPLICATED, trace
from jax import lax
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat, _rules


@pytest.mark.parametrize("c", [2.0, 3, 0.5])
def test_pcast_reduced_of_python_scalar(mesh_ij: Any, c: Any) -> None:
    """Was a bare AssertionError (reference Q13): `_compat.asarray_like` built the constant with
    `jnp.asarray(c)` (no dtype), which JAX's preduced rejects just like a Python scalar.
    Fixed by giving the dtype explicitly; JAX accepts the same constant."""
    seen: dict[str, Any] = {}

    def typed(x: Any) -> None:
        seen["typed"] = st.typeof(st.pcast(c, "i", to="reduced"))

    def raw(x: Any) -> None:
        seen["raw"] = st.typeof(lax.pcast(jnp.asarray(c, dtype=jnp.result_type(c)), "i",
                                          to="reduced"))
        with pytest.raises(AssertionError):   # JAX's own behaviour on the bare scalar (Q13)
            lax.pcast(jnp.asarray(c), "i", to="reduced")

    trace(mesh_ij, typed)
    trace(mesh_ij, raw, smap=jax.shard_map)
    assert seen["typed"] == seen["raw"] == st.SpmdType(reduced={"i"})


def test_where_with_reduced_branches_is_documented_stricter(mesh_ij: Any) -> None:
    """JAX accepts where(c, r, r) with c Invariant on r's reduced axis (result R); spmdtyped
    raises SPMD203, a row of STRICTER_THAN_JAX."""
    seen: dict[str, Any] = {}

    def raw(x: Any) -> None:
        r = lax.pcast(x, "i", to="reduced")
        seen["raw"] = st.typeof(jnp.where(x > 0, r, r))

    def typed(x: Any) -> None:
        r = st.pcast(x, "i", to="reduced")
        with pytest.raises(st.SpmdTypeError) as info:
            st.numpy.where(x > 0, r, r)
        seen["code"] = info.value.code

    trace(mesh_ij, raw, smap=jax.shard_map)
    trace(mesh_ij, typed)
    assert seen["raw"] == st.SpmdType(reduced={"i"})
    assert seen["code"] == "SPMD203"
    assert any(code == "SPMD203" and "where" in what for code, what, _ in _rules.STRICTER_THAN_JAX)


@pytest.mark.parametrize("op", ["<", ">", "**"])
def test_reduced_compared_with_scalar_is_documented_looser(mesh_ij: Any, op: str) -> None:
    """JAX rejects `r < 0.5` (Inputs cannot be replicated...); spmdtyped casts the scalar to
    Reduced, exactly as for + - * /. The result equals JAX's with the cast written out, and
    LOOSER_THAN_JAX lists the operator."""
    fns = {"<": lambda a, b: a < b, ">": lambda a, b: a > b, "**": lambda a, b: a ** b}
    seen: dict[str, Any] = {}

    def raw(x: Any) -> None:
        r = lax.pcast(x, "i", to="reduced")
        with pytest.raises(Exception, match="replicated"):
            fns[op](r, 0.5)
        c = lax.pcast(jnp.asarray(0.5, dtype=x.dtype), "i", to="reduced")
        y = fns[op](r, c)
        seen["raw"] = (st.typeof(y), y.dtype)

    def typed(x: Any) -> None:
        y = fns[op](st.pcast(x, "i", to="reduced"), 0.5)
        seen["typed"] = (st.typeof(y), y.dtype)

    trace(mesh_ij, raw, smap=jax.shard_map)
    trace(mesh_ij, typed)
    assert seen["typed"] == seen["raw"]
    rows = [case for case, _ in _rules.LOOSER_THAN_JAX if case.startswith("Reduced value")]
    assert rows and f" {op} " in rows[0]


def test_pvary_of_reduced_matches_jax_pvary_not_pcast(mesh_ij: Any) -> None:
    """`st.pvary` is JAX's pvary (Invariant -> Varying only): on a Reduced value both reject,
    while `pcast(to='varying')` is the Reduced -> Varying cast in both."""
    seen: dict[str, Any] = {}

    def raw(x: Any) -> None:
        r = lax.pcast(x, "i", to="reduced")
        with pytest.raises(ValueError, match="reduced"):
            jax._src.core.pvary(r, ("i",))
        seen["raw"] = st.typeof(lax.pcast(r, "i", to="varying"))

    def typed(x: Any) -> None:
        r = st.pcast(x, "i", to="reduced")
        with pytest.raises(st.SpmdTypeError) as info:
            st.pvary(r, "i")
        seen["code"] = info.value.code
        seen["typed"] = st.typeof(st.pcast(r, "i", to="varying"))

    trace(mesh_ij, raw, smap=jax.shard_map)
    trace(mesh_ij, typed)
    assert seen["code"] == "SPMD301"
    assert seen["typed"] == seen["raw"] == st.SpmdType(varying={"i"})


def _both(mesh: Any, raw_fn: Any, typed_fn: Any, spec: P = REPLICATED) -> dict[str, Any]:
    """Run `raw_fn` under jax.shard_map and `typed_fn` under st.shard_map; record state or error."""
    seen: dict[str, Any] = {}

    def record(key: str, fn: Any) -> Any:
        def body(x: Any) -> None:
            try:
                seen[key] = st.typeof(fn(x))
            except Exception as e:  # noqa: BLE001
                seen[key] = e
        return body

    trace(mesh, record("raw", raw_fn), spec, smap=jax.shard_map)
    trace(mesh, record("typed", typed_fn), spec)
    return seen


def test_reciprocal_drops_reduced_like_jax(mesh_ij: Any) -> None:
    """jnp.reciprocal is integer_pow(x, -1), which has no U/R rule: JAX drops Reduced (the
    table kept it, so check mode raised SPMD901)."""
    seen = _both(mesh_ij, lambda x: jnp.reciprocal(lax.pcast(x, "i", to="reduced")),
                 lambda x: st.numpy.reciprocal(st.pcast(x, "i", to="reduced")))
    if _compat.FEATURES.no_rule_rejects:  # jax 0.12.1 rejects it: so does spmdtyped, first
        assert isinstance(seen["raw"], NotImplementedError)
        assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD203"
        return
    assert seen["raw"] == seen["typed"] == st.SpmdType()


def test_reciprocal_of_unreduced_is_strict(mesh_ij: Any) -> None:
    """JAX drops Unreduced through reciprocal (a wrong value): SPMD202, a STRICTER_THAN_JAX row;
    under st.allow('SPMD202') spmdtyped follows JAX."""
    def typed(x: Any) -> Any:
        return st.numpy.reciprocal(st.pcast(x, "i", to="unreduced"))

    seen = _both(mesh_ij, lambda x: jnp.reciprocal(lax.pcast(x, "i", to="unreduced")), typed, P("i"))
    assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD202"

    def allowed(x: Any) -> Any:
        with st.allow("SPMD202"):
            return typed(x)

    with_allow = _both(mesh_ij, lambda x: jnp.reciprocal(lax.pcast(x, "i", to="unreduced")),
                       allowed, P("i"))["typed"]
    if _compat.FEATURES.no_rule_rejects:  # jax 0.12.1 rejects it: no opt-out makes it run
        assert isinstance(seen["raw"], NotImplementedError)
        assert isinstance(with_allow, st.SpmdTypeError) and with_allow.code == "SPMD202"
        return
    assert seen["raw"] == st.SpmdType()
    assert any(c == "SPMD202" and "reciprocal" in what for c, what, _ in _rules.STRICTER_THAN_JAX)
    assert with_allow == st.SpmdType()


@pytest.mark.parametrize("name", ["var", "std"])
def test_var_std_of_reduced_is_an_spmd_error(mesh_ij: Any, name: str) -> None:
    """jnp.var/std mix in a replicated constant: JAX raises `Inputs cannot be replicated...`;
    spmdtyped let that JAX error through. Now SPMD203 first."""
    seen = _both(mesh_ij, lambda x: getattr(jnp, name)(lax.pcast(x, "i", to="reduced")),
                 lambda x: getattr(st.numpy, name)(st.pcast(x, "i", to="reduced")))
    assert not isinstance(seen["raw"], st.SpmdTypeError) and "replicated" in str(seen["raw"])
    assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD203"


@pytest.mark.parametrize("op", ["%", "//"])
def test_mod_floordiv_of_reduced_is_an_spmd_error(mesh_ij: Any, op: str) -> None:
    """`r % r`, `r // r` (and jnp.mod/floor_divide) fail in JAX for every dtype: SPMD203 first.
    Next to a value Varying on the same axis (R -> V cast) both accept."""
    fn = {"%": lambda a, b: a % b, "//": lambda a, b: a // b}[op]
    seen = _both(mesh_ij, lambda x: fn(lax.pcast(x, "i", to="reduced"), lax.pcast(x, "i", to="reduced")),
                 lambda x: fn(st.pcast(x, "i", to="reduced"), st.pcast(x, "i", to="reduced")))
    assert "replicated" in str(seen["raw"])
    assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD203"
    seen = _both(mesh_ij, lambda x: fn(lax.pcast(x, "i", to="reduced"), lax.pcast(x, "i", to="varying")),
                 lambda x: fn(st.pcast(x, "i", to="reduced"), st.pvary(x, "i")))
    assert seen["raw"] == seen["typed"] == st.SpmdType(varying={"i"})


@pytest.mark.parametrize("cast,index_axis", [(None, "i"), ("reduced", "j"), ("reduced", "i"),
                                             ("varying", "j")])
def test_dynamic_index_takes_the_index_state(mesh_ij: Any, cast: Any, index_axis: str) -> None:
    """`x[st.axis_index(a)]` was typed from x alone, and dropped Reduced: check mode raised
    SPMD901 (JAX: the value is auto-cast to the index's varying axes; dynamic_slice keeps R)."""
    def prep(x: Any, pc: Any) -> Any:
        return x if cast is None else pc(x, "i", to=cast)

    seen = _both(mesh_ij, lambda x: prep(x, lax.pcast)[lax.axis_index(index_axis)],
                 lambda x: prep(x, st.pcast)[st.axis_index(index_axis)])
    if cast == "reduced" and index_axis == "j" and _compat.FEATURES.slice_index_invariant:
        # jax 0.12.1: a varying start index cannot slice a value still Reduced after the
        # auto-cast (on 'i' the index's varying axis turns Reduced['i'] into Varying['i'])
        assert "start_indices cannot be varying" in str(seen["raw"])
        assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD205"
        return
    assert not isinstance(seen["raw"], Exception), seen["raw"]
    assert seen["typed"] == seen["raw"]


def test_dynamic_index_of_unreduced_is_an_spmd_error(mesh_ij: Any) -> None:
    """JAX: `unreduced rule for dynamic_slice is not implemented` (jax 0.10 and 0.12.0), `start_indices
    cannot be varying` (0.12.1)."""
    seen = _both(mesh_ij, lambda x: lax.pcast(x, "i", to="unreduced")[lax.axis_index("j")],
                 lambda x: st.pcast(x, "i", to="unreduced")[st.axis_index("j")], P("i"))
    if _compat.FEATURES.slice_index_invariant:
        assert "start_indices cannot be varying" in str(seen["raw"])
    else:
        assert isinstance(seen["raw"], NotImplementedError)
    assert isinstance(seen["typed"], st.SpmdTypeError) and seen["typed"].code == "SPMD202"

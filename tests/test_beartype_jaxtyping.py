"""jaxtyping interop: `st.Float[Varying["dp"], "batch/dp d"]` checks state, dtype and the local
shape (global size / axis sizes) under `@jaxtyped(typechecker=beartype)`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import jaxtyping
import pytest
from _helpers import sds, trace
from beartype import beartype
from beartype.roar import BeartypeCallHintParamViolation
from jax.sharding import PartitionSpec as P
from jaxtyping import jaxtyped

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Varying


@jaxtyped(typechecker=beartype)
def shard_then_gather(x: st.Float[Varying["i"], "batch/i d"],
                      full: st.Float[Invariant, "batch d"]) -> st.Float[Varying["i"], "batch/i d"]:
    return x


@jaxtyped(typechecker=beartype)
def two_axes(x: st.Float[Varying["i", "j"], "n/(i,j)"]) -> st.Float[Invariant, "n"]:
    return st.all_gather(x, ("i", "j"), tiled=True, to="invarying")


def _expect_type_error(fn: Any, *args: Any) -> str:
    with pytest.raises(Exception) as info:  # jaxtyping's TypeCheckError (from beartype's)
        fn(*args)
    assert type(info.value).__name__ in ("TypeCheckError", "BeartypeCallHintParamViolation",
                                         "BeartypeCallHintReturnViolation"), info.value
    return str(info.value)


def test_local_and_global_shapes_bind_consistently(mesh_ij: Any) -> None:
    messages: list[str] = []

    def body(x: Any, y: Any) -> Any:
        # x: local (4, 3) = global (8, 3) over i=2; y: (8, 3) unpartitioned. batch = 8 for both.
        shard_then_gather(x, y)
        shard_then_gather(x.raw, y.raw)               # raw tracers too
        messages.append(_expect_type_error(shard_then_gather, x, y[:3]))   # batch 8 vs 3
        messages.append(_expect_type_error(shard_then_gather, x.astype(jnp.int32), y))  # dtype
        messages.append(_expect_type_error(shard_then_gather, y, y))  # y as x: global batch 16
        messages.append(_expect_type_error(shard_then_gather, st.pcast(y, "i", to="reduced"), y))
        return st.psum(x.sum(), "i")

    trace(mesh_ij, body, (P("i"), P()),
          args=[sds(mesh_ij, (8, 3), P("i")), sds(mesh_ij, (8, 3))])
    assert "parameter 'full'" in messages[0] and "batch=8" in messages[0]
    assert "parameter 'x'" in messages[1]
    assert "parameter 'full'" in messages[2] and "batch=16" in messages[2]
    assert "parameter 'x'" in messages[3]


def test_several_axes(mesh_ij: Any) -> None:
    def body(x: Any) -> Any:
        out = two_axes(x)  # local (2,), global 16 over i*j = 8
        assert out.shape == (16,)
        return st.psum(x.sum(), ("i", "j"))

    trace(mesh_ij, body, P(("i", "j")),
          args=[sds(mesh_ij, (16,), P(("i", "j")))])


def test_plain_beartype_gives_the_cause(mesh_ij: Any) -> None:
    @beartype
    def f(x: st.Float[Varying["i"], "b/i"]) -> None: ...

    def body(x: Any, c: Any) -> Any:
        f(x)
        with pytest.raises(BeartypeCallHintParamViolation,
                           match=r"this value is reduced over 'i', but the hint wants varying"):
            f(st.pcast(c, "i", to="reduced"))
        with pytest.raises(BeartypeCallHintParamViolation,
                           match=r"local shape \(4, 4\), global \(8, 4\)\) this array has 2 "
                                 r"dimensions|has local shape \(4, 4\)"):
            f(x.reshape(4, 4))
        return st.psum(x.sum(), "i")

    trace(mesh_ij, body, (P("i"), P()),
          args=[sds(mesh_ij, (32,), P("i")), sds(mesh_ij, (16,))])


def test_plain_jaxtyping_with_a_state_class(mesh_ij: Any) -> None:
    """jaxtyping's own `Float[...]` takes a state class as its array type (local shapes)."""

    @jaxtyped(typechecker=beartype)
    def f(x: jaxtyping.Float[Varying["i"], "b d"], y: jaxtyping.Float[Varying["i"], "b d"]) -> None: ...

    def body(x: Any, c: Any) -> Any:
        f(x, x * 2.0)
        _expect_type_error(f, x, c)       # c is (8, 3) locally: b=4 vs 8
        return st.psum(x.sum(), "i")

    trace(mesh_ij, body, (P("i"), P()),
          args=[sds(mesh_ij, (8, 3), P("i")), sds(mesh_ij, (8, 3))])


def test_bad_hints() -> None:
    with pytest.raises(st.UsageError, match="partitioned over 'j', so the value is Varying there"):
        st.Float[Varying["i"], "b/j d"]
    with pytest.raises(st.UsageError, match="is not a state hint"):
        st.Float[jax.Array, "b d"]
    with pytest.raises(st.UsageError, match="cannot read"):
        st.Float[Varying["i"], "b/i/j"]
    with pytest.raises(st.UsageError, match="takes a state hint and a dims string"):
        st.Float[Varying["i"]]
    with pytest.raises(st.UsageError, match="variadic"):
        st.Float[Varying["i"], "*rest b/i"]
    assert st.Float[Varying["i"], "b/i d"] is st.Float[Varying["i"], "b/i d"]
    assert st.Shaped[Reduced["i"], "d"].__qualname__ == "Shaped[Reduced['i'], 'd']"


def test_outside_shard_map_needs_the_axis() -> None:
    hint = st.Float[Varying["i"], "b/i"]
    value = st.wrap(jnp.zeros(3))  # Invariant: fits the state, but the axis size is unknown
    assert not isinstance(value, hint)
    assert type(hint).__instancecheck_str__(hint, value) == (
        "the axis size of 'i' is unknown here (the hint needs shard_map)")

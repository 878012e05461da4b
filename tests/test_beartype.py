"""Hints at call time: `isinstance`, `@beartype` and `beartype.claw`, on typed values and on raw
JAX tracers inside shard_map, with beartype's readable cause (`__instancecheck_str__`)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, Never

import pytest
from _helpers import trace
from beartype import beartype
from beartype.roar import BeartypeCallHintParamViolation, BeartypeCallHintReturnViolation
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying

# ---------------------------------------------------------------------------------------------
# one cached class per state


def test_one_class_per_state() -> None:
    assert Varying["i"] is Varying[Literal["i"]] is Typed[Varying["i"]]
    assert Varying["i", "j"] is Varying["j", "i"] is Varying["i | j"]
    assert Typed[Varying["i"], Reduced["j"]] is Typed[Reduced["j"], Varying["i"]]
    assert Typed[Invariant] is Invariant
    assert Varying["i"] is not Varying["j"]
    # the canonical static spelling works at runtime too
    assert st.SArray[Literal["i"], Never, Literal["j"]] is Typed[Varying["i"], Reduced["j"]]


def test_concrete_class_is_the_state(mesh_ij: Any) -> None:
    seen: list[type] = []

    def body(x: Any, y: Any) -> Any:
        r = st.pcast(st.psum(x, "j"), "j", to="reduced")
        seen.extend([type(x), type(y), type(r)])
        return st.psum(x, "j")

    trace(mesh_ij, body, (P("j"), P(("i", "j"))), local=(2,))
    assert seen == [Varying["j"], Varying["i", "j"], Reduced["j"]]


# ---------------------------------------------------------------------------------------------
# isinstance


def test_isinstance_typed_and_raw(mesh_ij: Any) -> None:
    results: dict[str, bool] = {}

    def body(x: Any) -> Any:
        raw = x.raw
        u = st.pcast(x, "j", to="unreduced")
        results.update({
            "typed exact": isinstance(x, Varying["j"]),
            "typed wider": isinstance(x, Varying["i", "j"]),   # Invariant on i <: Varying on i
            "typed narrower": isinstance(x, Invariant),
            "typed other axis": isinstance(x, Varying["i"]),
            "raw exact": isinstance(raw, Varying["j"]),
            "raw wider": isinstance(raw, Varying["i", "j"]),
            "raw wrong": isinstance(raw, Reduced["j"]),
            "unreduced exact": isinstance(u, Unreduced["j"]),
            "unreduced is not varying": isinstance(u, Varying["j"]),
            "raw unreduced": isinstance(u.raw, Unreduced["j"]),
            "invariant in varying": isinstance(st.psum(x, "j"), Varying["j"]),
            "family": isinstance(x, st.SArray),
        })
        return st.psum(x, "j")

    trace(mesh_ij, body, P("j"), local=(2,))
    assert results == {
        "typed exact": True, "typed wider": True, "typed narrower": False,
        "typed other axis": False, "raw exact": True, "raw wider": True, "raw wrong": False,
        "unreduced exact": True, "unreduced is not varying": False, "raw unreduced": True,
        "invariant in varying": True, "family": True,
    }


def test_isinstance_non_jax_values() -> None:
    assert not isinstance(1.0, Varying["i"])
    assert not isinstance("dp", Invariant)
    assert not isinstance(None, Typed[Varying["i"], Reduced["j"]])


# ---------------------------------------------------------------------------------------------
# @beartype


@beartype
def layer(x: Varying["j"], w: Invariant) -> Varying["j"]:
    return x * w


@beartype
def wants_reduced(w: Reduced["j"]) -> Invariant:
    return st.psum(st.pcast(w, "j", to="varying"), "j")


@beartype
def lies(x: Varying["j"]) -> Invariant:
    return x


def test_beartype_accepts_typed_and_raw(mesh_ij: Any) -> None:
    out: list[Any] = []

    def body(x: Any, c: Any) -> Any:
        out.append(layer(x, c))             # typed values
        out.append(layer(x.raw, c.raw))     # raw tracers: the state is read from JAX
        out.append(layer(st.psum(x, "j"), c))  # Invariant where Varying is expected
        w = st.pcast(c, "j", to="reduced")
        out.append(wants_reduced(w))

        # the raw call returns a raw tracer (raw * raw), which the return hint also checks
        assert not isinstance(type(out[1]), type(Varying["j"])) and isinstance(out[1], Varying["j"])
        return st.psum(x, "j")

    trace(mesh_ij, body, (P("j"), P()), local=(2,))
    assert [type(o) for i, o in enumerate(out) if i != 1] == [Varying["j"], Invariant, Invariant]


def test_beartype_param_violation_is_readable(mesh_ij: Any) -> None:
    def body(x: Any, c: Any) -> Any:
        wants_reduced(x)
        return st.psum(x, "j")

    with pytest.raises(BeartypeCallHintParamViolation) as info:
        trace(mesh_ij, body, (P("j"), P()), local=(2,))
    msg = str(info.value)
    assert "wants_reduced() parameter w=" in msg
    assert "violates type hint <class 'spmdtyped.Reduced['j']'>" in msg
    assert "as this value is varying over 'j', but the hint wants reduced" in msg


def test_beartype_raw_tracer_violation(mesh_ij: Any) -> None:
    def body(x: Any, c: Any) -> Any:
        layer(c.raw, x.raw)  # w must be Invariant; x is Varying over j
        return st.psum(x, "j")

    with pytest.raises(BeartypeCallHintParamViolation,
                       match="this value is varying over 'j', but the hint wants invariant"):
        trace(mesh_ij, body, (P("j"), P()), local=(2,))


def test_beartype_return_violation(mesh_ij: Any) -> None:
    def body(x: Any) -> Any:
        lies(x)
        return st.psum(x, "j")

    with pytest.raises(BeartypeCallHintReturnViolation, match="varying over 'j', but the hint wants invariant"):
        trace(mesh_ij, body, P("j"), local=(2,))


def test_instancecheck_str_wording() -> None:
    hint = Reduced["j"]
    assert type(hint).__instancecheck_str__(hint, 3.0) == (
        "float is not a typed spmdtyped value nor a JAX value inside shard_map")


# ---------------------------------------------------------------------------------------------
# beartype.claw on a user package


def test_beartype_claw_package(tmp_path: Path, mesh_ij: Any) -> None:
    pkg = tmp_path / "spmd_claw_user"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""\
        from beartype.claw import beartype_this_package
        beartype_this_package()
        """))
    (pkg / "model.py").write_text(textwrap.dedent("""\
        from __future__ import annotations  # string annotations: beartype resolves them

        import spmdtyped as st
        from spmdtyped import Invariant, Reduced, Varying


        def block(x: Varying["j"], w: Reduced["j"]) -> Varying["j"]:
            return x * st.pcast(w, "j", to="varying")


        def reduce(x: Varying["j"]) -> Invariant:
            return st.psum(x, "j")
        """))
    sys.path.insert(0, str(tmp_path))
    try:
        from spmd_claw_user import model  # type: ignore[import-not-found]

        ok: list[Any] = []

        def body(x: Any, c: Any) -> Any:
            w = st.pcast(c, "j", to="reduced")
            ok.append(type(model.block(x, w)))
            ok.append(type(model.reduce(x)))
            return st.psum(x, "j")

        trace(mesh_ij, body, (P("j"), P()), local=(2,))
        assert ok == [Varying["j"], Invariant]

        def bad(x: Any, c: Any) -> Any:
            model.block(x, c)  # c is Invariant, not Reduced
            return st.psum(x, "j")

        with pytest.raises(BeartypeCallHintParamViolation,
                           match=r"block\(\) parameter w=.*this value is invariant over 'j', but the "
                                 r"hint wants reduced"):
            trace(mesh_ij, bad, (P("j"), P()), local=(2,))
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("spmd_claw_user")]:
            del sys.modules[name]

"""The typed values' memo of their own typing (`_typed.memo`: `BINARY`, `CALLS`, `NARY`,
`COLLECTIVES`): an op met again with operands the rules
cannot tell apart is bound and compared with JAX, its state and refinement served from the
memo. Served or computed, every result must be the same: the same state class, the same
refinement, the same program, the same errors.

Each test traces on the (dp: 2, tp: 4) mesh; "memo off" replaces the key builders by ones that
never key (every op typed afresh, as before the memo).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import trace
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._ops import collectives as _collectives
from spmdtyped._typed import array as _array
from spmdtyped._typed import memo as _memo

snp = st.numpy

#: x, b: Invariant, w1: Shard 1 on tp, w2: Shard 0 on tp (8 x 8 each)
SPECS = (P(), P(None, "tp"), P("tp", None), P())

#: (name, op) pairs of forms whose typing reads their operands' refinements, shapes, literal
#: values and parameters: two of a kind differ only where a memo key must tell them apart
OPS: list[tuple[str, Callable[..., Any]]] = [
    ("matmul", lambda x, w1, w2, b: x @ w1),
    ("row-parallel", lambda x, w1, w2, b: (x @ w1) @ w2),
    ("psum", lambda x, w1, w2, b: st.psum((x @ w1) @ w2, "tp")),
    ("psum dp tp", lambda x, w1, w2, b: st.psum(st.pvary((x @ w1) @ w2, "dp"), ("dp", "tp"))),
    ("add", lambda x, w1, w2, b: w1 + w1),
    ("zero term", lambda x, w1, w2, b: (x @ w1) @ w2 + 0.0 * b),
    ("mul 0.5", lambda x, w1, w2, b: w1 * 0.5),
    ("mul 0", lambda x, w1, w2, b: w1 * 0),
    ("mul 0.0", lambda x, w1, w2, b: w1 * 0.0),
    ("pow 2", lambda x, w1, w2, b: w1 ** 2),
    ("pow 2.0", lambda x, w1, w2, b: w1 ** 2.0),
    ("mul True", lambda x, w1, w2, b: w1 * True),
    ("reshape 64", lambda x, w1, w2, b: w1.reshape(64)),
    ("reshape 4 16", lambda x, w1, w2, b: w1.reshape(4, 16)),
    ("reshape 8 2 4", lambda x, w1, w2, b: w1.reshape(8, 2, 4)),
    ("sum 0", lambda x, w1, w2, b: w1.sum(axis=0)),
    ("sum 1", lambda x, w1, w2, b: w1.sum(axis=1)),
    ("sum 1 keepdims", lambda x, w1, w2, b: w1.sum(axis=1, keepdims=True)),
    ("sum 1 keepdims=1", lambda x, w1, w2, b: w1.sum(axis=1, keepdims=1)),
    ("tanh", lambda x, w1, w2, b: snp.tanh(w1)),
    ("astype float16", lambda x, w1, w2, b: w1.astype(np.dtype("float16"))),
    ("astype jnp.float32", lambda x, w1, w2, b: w1.astype(jnp.float32)),
    ("sum dtype", lambda x, w1, w2, b: snp.sum(w2, axis=0, dtype=np.dtype("float32"))),
    ("softmax 0", lambda x, w1, w2, b: st.nn.softmax(w1, axis=0)),
    ("softmax -1", lambda x, w1, w2, b: st.nn.softmax(w2, axis=-1)),
    ("einsum ij,jk", lambda x, w1, w2, b: snp.einsum("ij,jk->ik", x, w1)),
    ("einsum ij,kj", lambda x, w1, w2, b: snp.einsum("ij,kj->ik", x, w1)),
    ("concatenate 0", lambda x, w1, w2, b: snp.concatenate([w1, w1], axis=0)),
    ("concatenate 1", lambda x, w1, w2, b: snp.concatenate([w1, w1], axis=1)),
    ("where 0.0", lambda x, w1, w2, b: snp.where(b > 0, (x @ w1) @ w2, 0.0)),
    ("where 1.0", lambda x, w1, w2, b: snp.where(b > 0, (x @ w1) @ w2, 1.0)),
    ("all_gather 1", lambda x, w1, w2, b: st.all_gather(w1, "tp", axis=1, tiled=True)),
    ("all_gather 0", lambda x, w1, w2, b: st.all_gather(w1, "tp", axis=0, tiled=True)),
    ("pcast unreduced", lambda x, w1, w2, b: st.pcast((x @ w1) @ w2, "tp", to="unreduced")),
    ("pvary", lambda x, w1, w2, b: st.pvary(b, "tp")),
]


def _clear() -> None:
    _memo.clear()


def _run(mesh: Any) -> tuple[list[tuple[str, str, Any]], str]:
    """Every op twice (the second time served where the memo keeps it): what each result is,
    and the traced program."""
    seen: list[tuple[str, str, Any]] = []

    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        for _ in range(2):
            for name, op in OPS:
                y = op(x, w1, w2, b)
                seen.append((name, type(y).__qualname__, _array.refinement_of(y)))

    _clear()
    traced = trace(mesh, body, SPECS)
    return seen, str(traced.jaxpr)


def test_served_typing_equals_computed(mesh_dp_tp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    on, program_on = _run(mesh_dp_tp)
    kept = len(_memo.BINARY) + len(_memo.CALLS) + len(_memo.NARY) \
        + len(_memo.COLLECTIVES)
    assert kept >= 20  # the memo is used (else this test compares nothing with itself)
    with monkeypatch.context() as m:
        m.setattr(_memo, "operands_key", lambda *a: None)
        m.setattr(_memo, "call_key", lambda *a: None)
        m.setattr(_collectives, "_leaf_key", lambda *a: None)
        off, program_off = _run(mesh_dp_tp)
    assert on == off
    assert program_on == program_off  # the same equations bound, served or not
    # the two passes agree, and the pairs of a kind differ where their typing does
    half = len(OPS)
    assert on[:half] == on[half:]
    got = {name: (cls, ref) for name, cls, ref in on[:half]}
    for a, b in (("reshape 64", "reshape 8 2 4"), ("sum 0", "sum 1"), ("mul 0.0", "mul 0.5"),
                 ("einsum ij,jk", "einsum ij,kj"), ("concatenate 0", "concatenate 1"),
                 ("all_gather 0", "all_gather 1"), ("psum", "row-parallel")):
        assert got[a] != got[b], (a, b)
    assert got["mul 0"][1].zero and got["mul 0.0"][1].zero and not got["mul 0.5"][1].zero
    assert got["astype float16"][1] == got["astype jnp.float32"][1]  # (a cast keeps it)
    assert "float16" in program_on
    assert "integer_pow" in program_on and "pow " in program_on.replace("integer_pow", "")


def test_errors_are_raised_every_time(mesh_dp_tp: Any) -> None:
    """A rule that raises is never memoised: the second bias added to a partial sum is the
    same error as the first, and so is an Unreduced operand of a non-linear op."""
    codes: list[str] = []

    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        partial = (x @ w1) @ w2
        unreduced = st.pcast(partial, "tp", to="unreduced")
        for _ in range(3):
            for bad in (lambda: partial + b, lambda: snp.tanh(unreduced),
                        lambda: st.psum(partial + 0.5 * b, "tp")):
                with pytest.raises(st.SpmdTypeError) as e:
                    bad()
                codes.append(e.value.code)

    _clear()
    trace(mesh_dp_tp, body, SPECS)
    assert codes[:3] == codes[3:6] == codes[6:], codes
    assert codes[0] == "SPMD210" and codes[2] == "SPMD210"


@pytest.mark.parametrize("allowed_first", [True, False])
def test_st_allow_is_part_of_the_key(mesh_dp_tp: Any, allowed_first: bool) -> None:
    """An op typed inside `with st.allow(code)` is never served outside it, nor the reverse."""
    got: list[str] = []

    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        partial = (x @ w1) @ w2

        def allowed() -> None:
            with st.allow("SPMD210"):
                partial + b
            got.append("allowed: ok")

        def outside() -> None:
            try:
                partial + b
                got.append("outside: ok")
            except st.SpmdTypeError as e:
                got.append(f"outside: {e.code}")

        for step in ((allowed, outside) if allowed_first else (outside, allowed)) * 2:
            step()

    _clear()
    trace(mesh_dp_tp, body, SPECS)
    assert sorted(set(got)) == ["allowed: ok", "outside: SPMD210"]
    assert len(got) == 4


def test_raw_operands_and_pytrees_are_typed_afresh(mesh_dp_tp: Any) -> None:
    """No key for a raw JAX operand, a NumPy array, `st.axis_size` or a pytree: those are
    typed as before (a raw operand's state read from JAX at each call)."""
    seen: list[Any] = []

    def body(x: Any, w1: Any, w2: Any, b: Any) -> None:
        _clear()
        raw = w1.raw * 2.0
        seen.append(type(w1 + raw).__qualname__)
        seen.append(type(w1 + np.float32(2.0)).__qualname__)
        partial = (x @ w1) @ w2
        # `b / st.axis_size("tp")` is this device's share of a partial sum; `b / 4` is not
        seen.append(_array.refinement_of(partial + b / st.axis_size("tp")).as_dict())
        with pytest.raises(st.SpmdTypeError, match="SPMD210"):
            partial + b / 4
        seen.append(st.psum({"a": partial, "b": partial}, "tp")["a"].refinement.as_dict())
        seen.append((len(_memo.BINARY), len(_memo.COLLECTIVES)))

    trace(mesh_dp_tp, body, SPECS)
    assert seen[0] == seen[1] == "Varying['tp']"
    assert seen[2] == {"tp": "Partial"}
    # kept: the two matmuls, `partial + share`, `b / 4`; no collective key for a pytree
    assert seen[4] == (4, 0)

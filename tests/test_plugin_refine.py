"""The static tier of Shard / Partial / Rep (the mypy plugin's `_mypy.refined`), without mypy runs.

The checker runs are in tests/typing/pass_refine.py, fail_refine.py and pass_refine_plain.py
(`tests/test_typing.py`); here: the encoding of refinements in `SArray`'s fourth argument, and
the property the plugin's fast path relies on (a `_refine` rule refines a result only from
refined operands, except the collectives it lists).
"""

from __future__ import annotations

import itertools

import pytest

from spmdtyped._mypy import collectives, operators, refined
from spmdtyped._rules import LITERAL, SpmdType
from spmdtyped._rules import refine as _refine
from spmdtyped._rules import refine_shape as _refine_shape

TP = SpmdType(varying={"tp"})
DP_TP = SpmdType(varying={"dp", "tp"})
INV = SpmdType()
PLAIN = [_refine.Arg(TP), _refine.Arg(DP_TP), _refine.Arg(INV), _refine.Arg(LITERAL)]


@pytest.mark.parametrize("name", sorted({r for r, _, _ in operators.BINARY.values()} - {"matmul"}))
def test_elementwise_of_plain_operands_is_plain(name: str) -> None:
    for a, b in itertools.product(PLAIN, repeat=2):
        assert _refine.elementwise(name, [a, b], DP_TP, op="t") == _refine.NONE


def test_other_rules_of_plain_operands_are_plain() -> None:
    for name in sorted(refined.REDUCTIONS):
        assert _refine.reduction(name, TP, _refine.NONE, TP, ndim=2, axis=0, op="t") == _refine.NONE
    for name in sorted(refined.ALONG):
        assert _refine.along_dim(name, TP, _refine.NONE, TP, ndim=2, axis=-1, op="t") == _refine.NONE
    assert _refine.einsum("ij,jk->ik", PLAIN[:2], DP_TP, op="t") == _refine.NONE
    assert _refine.elementwise("where", PLAIN[:3], DP_TP, op="t", onehot_fill=True) == _refine.NONE
    assert _refine_shape.transpose(TP, _refine.NONE, None, 2) == _refine.NONE
    for name in ("psum", "pmean", "pmax", "ppermute", "all_gather"):
        if name not in collectives._FROM_PLAIN:
            out = SpmdType() if name in ("psum", "pmean", "pmax") else TP
            # no refinement from a plain operand (a collective's result carries data: `data` set)
            assert _refine_shape.collective(name, TP, _refine.NONE, out, ("tp",), op="t").items == ()


def test_from_plain_collectives_do_refine() -> None:
    assert _refine_shape.collective("pvary", INV, _refine.NONE, TP, ("tp",), op="t").get("tp") is _refine.REP
    scattered = _refine_shape.collective("psum_scatter", TP, _refine.NONE, TP, ("tp",), shape=(4, 4),
                                   op="t", params={"scatter_dimension": 0, "tiled": True})
    assert scattered.get("tp") == _refine.Shard(-2)


def test_refinement_slot_round_trip() -> None:
    """Every kind survives `k_type` -> `read_k`; two kinds for one axis read as plain."""
    from mypy.types import LiteralType, UnionType

    class _Api:  # `str_type` only needs the checker's `named_type`
        def named_type(self, name: str, args: list[object]) -> object:
            from mypy.nodes import Block, ClassDef, SymbolTable, TypeInfo
            from mypy.types import Instance

            info = TypeInfo(SymbolTable(), ClassDef("str", Block([])), "builtins")
            info._fullname = name
            return Instance(info, [])

    api = _Api()
    kinds = {"dp": _refine.Shard(-2), "tp": _refine.PARTIAL, "ep": _refine.REP, "sp": _refine.INDEX,
             "pp": _refine.ONEHOT, "fsdp": 0}
    k = refined.k_type(api, kinds, 3)
    assert refined.read_k(k) == (kinds, 3)
    assert isinstance(k, UnionType)
    merged = UnionType.make_union([*k.items, LiteralType("tp=S-1", k.items[0].fallback)])  # type: ignore[attr-defined]
    got, _ = refined.read_k(merged)
    assert "tp" not in got and got["dp"] == _refine.Shard(-2)

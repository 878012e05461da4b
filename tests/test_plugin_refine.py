"""The static tier of Shard / Partial / Rep (the mypy plugin's `_mypy.refined`).

The checker runs are in tests/typing/pass_refine.py, fail_refine.py and pass_refine_plain.py
(`tests/test_typing.py`); here: the encoding of refinements in `SArray`'s fourth argument, the
property the plugin's fast path relies on (a `_refine` rule refines a result only from refined
operands, except the collectives it lists), and one mypy run checking that the plugin and the
runtime agree on the pre-divided row-parallel bias (`b / st.axis_size("tp")`).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from spmdtyped import _rules, _surface
from spmdtyped._mypy import operators, refined
from spmdtyped._rules import LITERAL, SpmdType
from spmdtyped._rules import refine as _refine
from spmdtyped._rules.refine import shape as _refine_shape

TP = SpmdType(varying={"tp"})
DP_TP = SpmdType(varying={"dp", "tp"})
INV = SpmdType()
PLAIN = [_refine.Arg(TP), _refine.Arg(DP_TP), _refine.Arg(INV), _refine.Arg(LITERAL)]


@pytest.mark.parametrize("name", sorted({r for r, _, _ in operators.BINARY.values()} - {"matmul"}))
def test_elementwise_of_plain_operands_is_plain(name: str) -> None:
    for a, b in itertools.product(PLAIN, repeat=2):
        assert _refine.elementwise(name, [a, b], DP_TP, op="t") == _refine.NONE


def test_other_rules_of_plain_operands_are_plain() -> None:
    kinds = _surface.REFINE_OF_RULE
    for name in sorted(r for r, k in kinds.items() if k == "reduction"):
        assert _refine.reduction(name, TP, _refine.NONE, TP, ndim=2, axis=0, op="t") == _refine.NONE
    for name in sorted(r for r, k in kinds.items() if k in ("along", "take")):
        assert _refine.along_dim(name, TP, _refine.NONE, TP, ndim=2, axis=-1, op="t") == _refine.NONE
    assert _refine.einsum("ij,jk->ik", PLAIN[:2], DP_TP, op="t") == _refine.NONE
    assert _refine.elementwise("where", PLAIN[:3], DP_TP, op="t", onehot_fill=True) == _refine.NONE
    assert _refine_shape.transpose(TP, _refine.NONE, None, 2) == _refine.NONE
    for name in ("psum", "pmean", "pmax", "ppermute", "all_gather"):
        if not _rules.AXIS_OPS[name].from_plain:
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


def test_refinement_slot_keeps_a_share() -> None:
    """A share (`b / st.axis_size(("dp", "tp"))`) survives `k_type` -> `read`, also on a value
    with no refined axis; two different shares merged by mypy read as none."""
    from mypy.nodes import Block, ClassDef, SymbolTable, TypeInfo
    from mypy.types import Instance, UnionType

    from spmdtyped._mypy.convert import SARRAY

    class _Api:
        def named_type(self, name: str, args: list[object]) -> object:
            info = TypeInfo(SymbolTable(), ClassDef(name.rpartition(".")[2], Block([])),
                            name.rpartition(".")[0])
            info._fullname = name
            return Instance(info, [])

    api = _Api()
    share = _refine.Refinement(share=("dp", "tp"))
    k = refined.k_type(api, share, None)
    sarray = api.named_type(SARRAY, [])
    assert isinstance(sarray, Instance)
    ref, _ = refined.read(sarray.copy_modified(args=[k, k, k, k]))
    assert ref.share == ("dp", "tp") and not ref.items
    other = refined.k_type(api, _refine.Refinement(share=("tp",)), None)
    assert isinstance(k, UnionType) and isinstance(other, UnionType)
    merged = UnionType.make_union([*k.items, *other.items])
    assert refined.read(sarray.copy_modified(args=[k, k, k, merged]))[0].share == ()


#: (expression, the error code of both tiers or None): `h @ w2` is Partial over tp, `q` over dp
#: and tp, `b` Invariant, `r` Rep over tp, `n = st.axis_size("tp")`, `nn` of ("dp", "tp")
SHARE_FORMS = [
    ("h @ w2 + b / n", None),
    ("h @ w2 + b * (1 / n)", None),
    ("(1 / n) * b + h @ w2", None),
    ("h @ w2 - r / n", None),
    ("q + b / nn", None),
    ("h @ w2 + b", "SPMD210"),
    ("h @ w2 + b / 4", "SPMD210"),                      # a literal is not the axis size
    ('h @ w2 + b / st.axis_size("dp")', "SPMD210"),     # the size of another axis
    ("h @ w2 + (b / n) * 2", "SPMD210"),                # scaled again: a bias again
    ("h @ w2 + b * (2 / n)", "SPMD210"),
    ("q + b / n", "SPMD210"),                           # a share over tp, a partial sum over dp too
]


def _runtime_outcome(form: str) -> str | None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import spmdtyped as st

    def body(h: Any, w2: Any, b: Any, hh: Any, ww: Any) -> Any:
        env = {"st": st, "h": h, "w2": w2, "b": b, "r": st.pvary(b, "tp"), "q": hh @ ww,
               "n": st.axis_size("tp"), "nn": st.axis_size(("dp", "tp"))}
        return st.psum(eval(form, env), ("dp", "tp") if "q" in form else "tp")  # noqa: S307

    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    f = st.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P(),
                                                P(None, ("dp", "tp")), P(("dp", "tp"), None)),
                     out_specs=P())
    x = jax.ShapeDtypeStruct((4, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    try:
        jax.eval_shape(f, x, w, jax.ShapeDtypeStruct((8,), jnp.float32), x, w)
    except st.SpmdTypeError as e:
        return e.code
    return None


def test_plugin_and_runtime_agree_on_the_pre_divided_bias(tmp_path: Path) -> None:
    from test_typing import CACHE, mypy_config, mypy_errors, run_mypy

    from spmdtyped._mypy.codes import CODES

    lines = ["import spmdtyped as st", "from spmdtyped import Invariant", "",
             'def f(h: st.Shard["tp", -1], w2: st.Shard["tp", -2], b: Invariant, r: st.Rep["tp"],',
             '      q: st.Partial["dp", "tp"]) -> None:',
             '    n = st.axis_size("tp")', '    nn = st.axis_size(("dp", "tp"))']
    first = len(lines) + 1
    lines += [f"    {form}" for form, _ in SHARE_FORMS]
    module = tmp_path / "share_forms.py"
    module.write_text("\n".join(lines) + "\n")
    _, out = run_mypy([module], mypy_config(tmp_path, plugin=True), CACHE, cwd=tmp_path)
    got = mypy_errors(out)
    slugs = {CODES[code].code: code for code in CODES}
    for i, (form, want) in enumerate(SHARE_FORMS):
        codes = [slugs.get(c, c) for (_, line, c), n in got.items() if line == first + i for _ in range(n)]
        static = codes[0] if len(codes) == 1 else (None if not codes else tuple(codes))
        assert (static, _runtime_outcome(form)) == (want, want), (form, out)


#: (expression, the plugin's code, the runtime's code, the single-device reference of an
#: accepted form): `q` is `st.Float[Varying["dp", "tp"], "b/dp h/tp t d"]`, `sinks` an Invariant
#: vector, `b, h, t, d = q.shape` (local). The plugin reads the extent `h` of the tp-sharded
#: heads (`Refinement.extents`); it knows no sizes, so a replicated value of another extent
#: laid along the heads (`sinks[:t]`, t = 2 here) is left to the runtime, which reads it.
EXTENT_FORMS: list[tuple[str, str | None, str | None, Any]] = [
    ("st.numpy.concatenate([q, st.numpy.broadcast_to(sinks[:h, None, None], (b, h, t, 1))], -1)",
     "SPMD215", "SPMD215", None),
    ("q + sinks[:h, None, None]", "SPMD215", "SPMD215", None),
    ("q * sinks[0:h][:, None, None]", "SPMD215", "SPMD215", None),
    ("q + sinks[None, None, None, :d]", None, None, lambda q, s: q + s[:2]),
    ("q + st.numpy.broadcast_to(sinks[None, None, None, :1], (b, h, t, 1))", None, None,
     lambda q, s: q + s[0]),
    ("q + sinks[:t, None, None]", None, "SPMD215", None),   # out of static reach: t's size
]


def _extent_outcome(form: str, reference: Any) -> str | None:
    """The runtime's code for `form`, or None after running it on 8 devices and comparing it
    with `reference` on the global arrays."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import spmdtyped as st

    def body(q: Any, sinks: Any) -> Any:
        b, h, t, d = q.shape
        env = {"st": st, "q": q, "sinks": sinks, "b": b, "h": h, "t": t, "d": d}
        return eval(form, env)  # noqa: S307

    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    spec = P("dp", "tp")
    f = jax.jit(st.shard_map(body, mesh=mesh, in_specs=(spec, P()), out_specs=spec))
    q = jnp.arange(4 * 8 * 2 * 2, dtype=jnp.float32).reshape(4, 8, 2, 2) / 10
    sinks = jnp.linspace(-1.0, 1.0, 8, dtype=jnp.float32)
    try:
        got = f(q, sinks)
    except st.SpmdTypeError as e:
        return e.code
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference(q, sinks)), rtol=1e-6)
    return None


def test_plugin_and_runtime_on_static_extents(tmp_path: Path) -> None:
    """The plugin's SPMD215 from static extents is the runtime's; every form both accept
    lowers, runs and equals its single-device reference (this JAX leg)."""
    from test_typing import CACHE, mypy_config, mypy_errors, run_mypy

    from spmdtyped._mypy.codes import CODES

    lines = ["# ruff: noqa: F722, F821", "import spmdtyped as st", "from spmdtyped import Invariant, Varying",
             "", 'def f(q: st.Float[Varying["dp", "tp"], "b/dp h/tp t d"], sinks: st.Float[Invariant, "n"]'
             ") -> None:", "    b, h, t, d = q.shape"]
    first = len(lines) + 1
    lines += [f"    {form}" for form, *_ in EXTENT_FORMS]
    module = tmp_path / "extent_forms.py"
    module.write_text("\n".join(lines) + "\n")
    _, out = run_mypy([module], mypy_config(tmp_path, plugin=True), CACHE, cwd=tmp_path)
    got = mypy_errors(out)
    slugs = {CODES[code].code: code for code in CODES}
    for i, (form, static_want, runtime_want, reference) in enumerate(EXTENT_FORMS):
        codes = [slugs.get(c, c) for (_, line, c), n in got.items() if line == first + i for _ in range(n)]
        static = codes[0] if len(codes) == 1 else (None if not codes else tuple(codes))
        assert (static, _extent_outcome(form, reference)) == (static_want, runtime_want), (form, out)

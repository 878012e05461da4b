"""The surface table (`spmdtyped._surface`) against the runtime: every row is implemented, and
gives the table's state for every state of its operands.

Each form runs inside a real full-manual shard_map on a (dp: 2, tp: 4) mesh, on values in all
16 states over (dp, tp) (and Python scalars where the form takes them). For each case the rule
the row names is asked first (`_rules.binary`, `unary`, `combine`, `at_update_type`,
`axis_op`, ...): where it rejects, the runtime must raise an `SpmdTypeError` with the same code;
where it accepts, the result's state (`st.typeof`) must be that state, and so must JAX's own
(`st.typeof(result.raw)`, read from `jax.typeof`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _helpers import make_raw
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.lax as slax
import spmdtyped.nn as snn
import spmdtyped.numpy as snp
from spmdtyped import SpmdType, _compat, _rules, _surface
from spmdtyped._typed.hints import SArray

AXES = ("dp", "tp")
F = _compat.FEATURES
_MESH: list[Any] = []


def mesh() -> Any:
    if not _MESH:
        _MESH.append(jax.make_mesh((2, 4), AXES))
    return _MESH[0]


def all_states() -> list[SpmdType]:
    """Every assignment of Invariant/Varying/Unreduced/Reduced to (dp, tp): 16 states."""
    out = []
    for combo in itertools.product("IVUR", repeat=len(AXES)):
        kw: dict[str, list[str]] = {"varying": [], "unreduced": [], "reduced": []}
        for axis, s in zip(AXES, combo, strict=True):
            key = {"V": "varying", "U": "unreduced", "R": "reduced"}.get(s)
            if key:
                kw[key].append(axis)
        out.append(SpmdType(**kw))
    return out


STATES = all_states()




def trace(fn: Callable[[Any], None], shape: tuple[int, ...] = (4, 4), dtype: Any = jnp.float32) -> None:
    """Trace `fn(x)` inside a full-manual shard_map on the (dp: 2, tp: 4) mesh (`x`: an
    Invariant raw value); nothing is compiled or run."""
    def body(x: Any) -> Any:
        fn(x)
        return jnp.zeros((), jnp.float32)

    sm = jax.shard_map(body, mesh=mesh(), in_specs=P(), out_specs=P())
    jax.jit(sm).trace(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh(), P())))


def expect(rule: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", state) or ("spmd", code) of a rule-table call."""
    try:
        res = rule()
    except st.SpmdTypeError as e:
        return "spmd", e.code
    return "ok", res.type if isinstance(res, _rules.Combined) else res


def check(form: str, case: object, want: tuple[str, Any], run: Callable[[], Any]) -> None:
    """The runtime form gives the rule's state (and JAX agrees), or the rule's error code."""
    try:
        got = run()
    except st.SpmdTypeError as e:
        assert want == ("spmd", e.code), f"{form} on {case}: runtime raised {e.code}, table: {want}"
        return
    assert want[0] == "ok", f"{form} on {case}: runtime accepted, the table raises {want[1]}"
    assert st.typeof(got) == want[1], f"{form} on {case}: {st.typeof(got)} != table {want[1]}"
    assert st.typeof(st.unwrap(got)) == want[1], f"{form} on {case}: JAX computed {st.typeof(st.unwrap(got))}"


def typed_values(x: Any) -> dict[SpmdType, Any]:
    return {t: st.wrap(make_raw(x, t)) for t in STATES}


# ------------------------------------------------------------------------------ operators

INT_OPS = {"and", "or", "xor"}


def _literal(rule: str) -> int:
    return 3 if rule in INT_OPS else 2


@pytest.mark.parametrize("row", _surface.OPERATORS, ids=lambda r: r.form)
def test_operator_row(row: _surface.Row) -> None:
    assert callable(getattr(SArray, row.name)), row.name
    if row.reflected:
        assert callable(getattr(SArray, row.reflected)), row.reflected
    dunder = getattr(SArray, row.name)
    c = _literal(row.rule)

    def body(x: Any) -> None:
        vals = typed_values(x)
        for a, b in itertools.product(STATES, STATES):
            check(row.form, (a, b), expect(lambda: _rules.binary(row.rule, a, b, F)),  # noqa: B023
                  lambda: dunder(vals[a], vals[b]))  # noqa: B023
        for a in STATES if row.rule != "matmul" else ():  # `x @ 2` is a shape error
            check(row.form, (a, c), expect(lambda: _rules.binary(row.rule, a, _rules.LITERAL, F,  # noqa: B023
                                                                 int_literal=True)),
                  lambda: dunder(vals[a], c))  # noqa: B023
            if row.reflected:
                check(row.form, (c, a), expect(lambda: _rules.binary(row.rule, _rules.LITERAL, a, F)),  # noqa: B023
                      lambda: getattr(vals[a], row.reflected)(c))  # noqa: B023

    trace(body, dtype=jnp.int32 if row.rule in INT_OPS else jnp.float32)


@pytest.mark.parametrize("row", _surface.UNARY_OPERATORS, ids=lambda r: r.form)
def test_unary_operator_row(row: _surface.Row) -> None:
    dunder = getattr(SArray, row.name)

    def body(x: Any) -> None:
        vals = typed_values(x)
        for t in STATES:
            check(row.form, t, expect(lambda: _rules.unary(row.rule, t, F)), lambda: dunder(vals[t]))  # noqa: B023

    trace(body, dtype=jnp.int32 if row.rule == "logical_not" else jnp.float32)


def test_drift_bugs_of_issue_11() -> None:
    """`x % 2`, `x // 2`, `&|^`, `==`/`!=` typed through the table; `axis_index == 0` varies."""
    seen: dict[str, SpmdType] = {}

    def body(x: Any) -> None:
        v = st.wrap(make_raw(x, SpmdType(varying="dp")))
        i = st.axis_index("tp")
        seen["axis_index == 0"] = st.typeof(i == 0)
        seen["0 != axis_index"] = st.typeof(0 != i)
        seen["x % 2"] = st.typeof(v % 2)
        seen["x // 2"] = st.typeof(v // 2)
        seen["i & 1 | i ^ 2"] = st.typeof((i & 1) | (i ^ 2))

    trace(body)
    assert seen["axis_index == 0"] == SpmdType(varying="tp")
    assert seen["0 != axis_index"] == SpmdType(varying="tp")
    assert seen["x % 2"] == seen["x // 2"] == SpmdType(varying="dp")
    assert seen["i & 1 | i ^ 2"] == SpmdType(varying="tp")


# ------------------------------------------------------------------------------ methods, indexing

METHOD_ARGS: dict[str, tuple[Any, ...]] = {"reshape": (-1,), "astype": (jnp.float32,)}


@pytest.mark.parametrize("row", (*_surface.METHODS, *_surface.PROPERTIES), ids=lambda r: r.form)
def test_method_and_property_rows(row: _surface.Row) -> None:
    def body(x: Any) -> None:
        vals = typed_values(x)
        for t in STATES:
            if row.rule is None:  # a plain attribute of the JAX value
                assert getattr(vals[t], row.name) == getattr(vals[t].raw, row.name)
                continue
            if row.kind == "property":
                run = lambda: getattr(vals[t], row.name)  # noqa: B023, E731
            else:
                run = lambda: getattr(vals[t], row.name)(*METHOD_ARGS.get(row.name, ()))  # noqa: B023, E731
            check(row.form, t, expect(lambda: _unary_rule(row, t)), run)  # noqa: B023

    trace(body)


def _unary_rule(row: _surface.Row, t: SpmdType) -> SpmdType:
    if row.binding == "mean":
        return _rules.mean_type(t, F)
    return _rules.unary(row.rule, t, F)  # type: ignore[arg-type]


def test_indexing_rows() -> None:
    static, traced = _surface.INDEXING

    def body(x: Any) -> None:
        vals = typed_values(x)
        idx = st.axis_index("tp")
        for t in STATES:
            check(static.form, t, expect(lambda: _rules.unary(static.rule, t, F)), lambda: vals[t][1])  # noqa: B023
            check(traced.form, t, expect(lambda: _rules.dynamic_index_type(t, [st.typeof(idx)], F)),  # noqa: B023
                  lambda: vals[t][idx])  # noqa: B023

    trace(body)


@pytest.mark.parametrize("row", _surface.AT, ids=lambda r: r.form)
def test_at_rows(row: _surface.Row) -> None:
    def body(x: Any) -> None:
        vals = typed_values(x)
        for t in STATES:
            for v in (*STATES, None):
                value = 1.0 if v is None else vals[v][0]
                tv = _rules.LITERAL if v is None else _rules.unary("getitem", v, F)
                check(row.form, (t, v), expect(lambda: _rules.at_update_type(row.name, t, tv, F)),  # noqa: B023
                      lambda: getattr(vals[t].at[0], row.name)(value))  # noqa: B023

    trace(body)


# ------------------------------------------------------------------------------ st.numpy, st.nn

#: extra arguments of unary st.numpy functions that need them
NUMPY_ARGS: dict[str, tuple[Any, ...]] = {
    "reshape": ((16,),), "transpose": ((1, 0),), "swapaxes": (0, 1), "moveaxis": (0, 1),
    "expand_dims": (0,), "broadcast_to": ((2, 4, 4),), "roll": (1,), "tile": (2,),
    "repeat": (2,), "pad": (1,), "full_like": (3.0,)}
NEW_ARGS: dict[str, tuple[Any, ...]] = {
    "zeros": ((2,),), "ones": ((2,),), "empty": ((2,),), "full": ((2,), 1.0), "arange": (3,),
    "linspace": (0.0, 1.0, 3), "eye": (2,)}
BOOL_ONLY = {"logical_not", "logical_and", "logical_or", "logical_xor"}


def _numpy_case(row: _surface.Row, vals: dict[SpmdType, Any], states: tuple[SpmdType, ...]
                ) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(rule call, runtime call) of st.numpy row `row` on operands in `states`."""
    f = getattr(snp, row.name)
    ops = [vals[s] for s in states]
    rule, b = row.rule, row.binding
    if b == "mean":
        return (lambda: _rules.mean_type(states[0], F)), (lambda: f(ops[0]))
    if b == "unary":
        # a real array: no primitive; pad's default is the zero constant's row
        want_rule = {"real": "copy", "pad": "pad_zero"}.get(row.name, rule)
        if row.name == "imag":
            return (lambda: _rules.constructor_type("zeros_like", states[0], F)), (lambda: f(ops[0]))
        return (lambda: _rules.unary(want_rule, states[0], F)), \
            (lambda: f(ops[0], *NUMPY_ARGS.get(row.name, ())))
    if b == "binary":
        return (lambda: _rules.binary(rule, states[0], states[1], F)), (lambda: f(ops[0], ops[1]))
    if b == "where":
        # the condition `c > 0` is typed by the `gt` rule with a literal
        cond = _rules.binary("gt", states[0], _rules.LITERAL, F).type
        return (lambda: _rules.where_type(cond, states[1], states[2], F)), \
            (lambda: f(ops[0] > 0, ops[1], ops[2]))
    if b == "join":
        return (lambda: _rules.combine(rule, list(states), F)), (lambda: f([ops[0], ops[1]]))
    if b == "einsum":
        return (lambda: _rules.combine(rule, list(states), F)), (lambda: f("ij,jk->ik", ops[0], ops[1]))
    if b == "take":
        idx = st.axis_index("tp")
        if row.name == "take_along_axis":  # an index of the array's rank
            idx = snp.broadcast_to(idx, (4, 4))
        return (lambda: _rules.take_type(states[0], st.typeof(idx), F)), (lambda: f(ops[0], idx))
    if b == "slice":  # a traced start index: `x[i]`'s rule
        idx = st.axis_index("tp")
        return (lambda: _rules.dynamic_index_type(states[0], [st.typeof(idx)], F)), \
            (lambda: f(ops[0], idx, 2))
    if b == "split":  # every piece in the unary rule's state
        return (lambda: _rules.unary(rule, states[0], F)), (lambda: f(ops[0], 2)[0])
    if b == "like":
        return (lambda: _rules.constructor_type(rule, states[0], F)), \
            (lambda: f(ops[0], *NUMPY_ARGS.get(row.name, ())))
    assert b == "new", row
    return (lambda: _rules.constructor_type(rule)), (lambda: f(*NEW_ARGS[row.name]))


@pytest.mark.parametrize("row", _surface.NUMPY, ids=lambda r: r.name)
def test_numpy_row(row: _surface.Row) -> None:
    assert callable(getattr(snp, row.name)), row.name
    n = {"unary": 1, "mean": 1, "like": 1, "take": 1, "new": 0, "where": 3, "slice": 1,
         "split": 1}.get(row.binding, 2)
    # three operands: every state of the branches under an Invariant / Varying condition
    cases = ([(c, a, b) for c in STATES[:2] for a in STATES for b in STATES] if n == 3
             else list(itertools.product(STATES, repeat=n)))

    def body(x: Any) -> None:
        vals = typed_values(x)
        if row.name in BOOL_ONLY:
            vals = {t: v > 0 for t, v in vals.items() if not t.unreduced}
        for states in cases:
            if all(s in vals for s in states):
                rule, run = _numpy_case(row, vals, states)
                check(row.form, states, expect(rule), run)

    trace(body)


@pytest.mark.parametrize("row", _surface.NN, ids=lambda r: r.name)
def test_nn_row(row: _surface.Row) -> None:
    f = getattr(snn, row.name)
    args = (3,) if row.name == "one_hot" else ()

    def body(x: Any) -> None:
        vals = typed_values(x)
        for t in STATES:
            check(row.form, t, expect(lambda: _rules.unary(row.rule, t, F)), lambda: f(vals[t], *args))  # noqa: B023

    trace(body, dtype=jnp.int32 if row.name == "one_hot" else jnp.float32)


def test_function_tables_are_views_of_the_surface() -> None:
    assert {r.name: r.rule for r in _surface.NUMPY} == snp.RULES
    assert {r.name: r.rule for r in _surface.NN} == snn.RULES
    assert not hasattr(_rules, "NUMPY_FUNCTIONS")  # the rule table does not read the surface
    assert set(snp.__all__) == {r.name for r in _surface.NUMPY}
    assert set(snn.__all__) == {r.name for r in _surface.NN}


# ------------------------------------------------------------------------------ collectives

#: keyword arguments that select each AXIS_OPS row through its public function
CALLS: dict[str, Callable[[Any], Any]] = {
    "psum": lambda v: st.psum(v, "tp"), "pmean": lambda v: st.pmean(v, "tp"),
    "pmax": lambda v: st.pmax(v, "tp"), "pmin": lambda v: st.pmin(v, "tp"),
    "ppermute": lambda v: st.ppermute(v, "tp", [(k, (k + 1) % 4) for k in range(4)]),
    "pshuffle": lambda v: st.pshuffle(v, "tp", [1, 2, 3, 0]),
    "pbroadcast": lambda v: st.pbroadcast(v, "tp", 0),
    "all_gather": lambda v: st.all_gather(v, "tp", tiled=True),
    "all_gather_invarying": lambda v: st.all_gather(v, "tp", tiled=True, to="invarying"),
    "all_gather_reduced": lambda v: st.all_gather(v, "tp", tiled=True, to="reduced"),
    "psum_scatter": lambda v: st.psum_scatter(v, "tp", tiled=True),
    "all_to_all": lambda v: st.all_to_all(v, "tp", 0, 0, tiled=True),
    "pcast_varying": lambda v: st.pcast(v, "tp", to="varying"),
    "pcast_reduced": lambda v: st.pcast(v, "tp", to="reduced"),
    "pcast_unreduced": lambda v: st.pcast(v, "tp", to="unreduced"),
    "pvary": lambda v: st.pvary(v, "tp"),
}


def test_every_collective_is_public() -> None:
    for c in _surface.COLLECTIVES:
        assert callable(getattr(st, c.name)), c.name
        assert c.name in st.__all__, c.name
        if c.in_lax:
            assert callable(getattr(slax, c.name)) and c.name in slax.__all__, c.name
    assert set(slax.__all__) == set(_surface.LAX_NAMES)
    assert set(CALLS) == {r.rule for r in _surface.COLLECTIVE_ROWS} == set(_rules.AXIS_OPS)


@pytest.mark.parametrize("row", _surface.COLLECTIVE_ROWS, ids=lambda r: r.rule)
def test_collective_row(row: _surface.Row) -> None:
    call = CALLS[row.rule]

    def body(x: Any) -> None:
        vals = typed_values(x)
        for t in STATES:
            check(f"{row.form} [{row.rule}]", t,
                  expect(lambda: _rules.axis_op(row.rule, t, ("tp",), F)), lambda: call(vals[t]))  # noqa: B023

    trace(body)


def test_rows_are_one_flat_iterable() -> None:
    """`_surface.ROWS`: what a runtime-vs-mypy parity test loops over."""
    assert len({(r.kind, r.name, r.rule) for r in _surface.ROWS}) == len(_surface.ROWS)
    for r in _surface.ROWS:
        assert r.form and r.kind and r.arity >= 0
    assert _surface.by_dunder("__rmod__") is _surface.by_dunder("__mod__")
    assert _surface.by_dunder("__mod__").rule == "mod"  # type: ignore[union-attr]
    assert _surface.by_attribute("sum").rule == "sum"  # type: ignore[union-attr]
    assert _surface.by_function("numpy", "remainder").rule == "mod"  # type: ignore[union-attr]
    assert _surface.collective("psum_scatter").ops == ("psum_scatter",)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ no rule by name

#: the runtime modules built from the table: none may pick a rule by a function's name
_BUILT_FROM_THE_TABLE = ("numpy.py", "nn.py", "_typed/array.py", "_typed/attributes.py", "lax.py",
                         "_ops/collectives.py")
#: (module, name) pairs a module may compare with for a reason other than the rule:
#: `x.transpose(1, 0)` takes the permutation as separate arguments (argument parsing)
_NAME_ALLOWED = {("attributes.py", "transpose")}


def _name_special_cases(path: Any, names: set[str]) -> list[str]:
    """String constants in `path` that name a surface row and are compared with (`==`, `in`)
    or used as dict keys (`{"real": ...}`, `dict.fromkeys(("sum", ...))`): a rule mapped by
    name outside the surface table."""
    import ast

    tree = ast.parse(path.read_text())
    found: list[str] = []

    def consts(node: ast.AST) -> list[str]:
        return [n.value for n in ast.walk(node)
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]

    for node in ast.walk(tree):
        hits: list[str] = []
        if isinstance(node, ast.Compare):
            hits = [v for c in node.comparators for v in consts(c)]
            hits += consts(node.left) if node.comparators and not isinstance(node.left, ast.Constant) \
                else []
        elif isinstance(node, ast.Dict):
            hits = [v for k in node.keys if k is not None for v in consts(k)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "fromkeys" and node.args:
            hits = consts(node.args[0])
        found += [f"{path.name}:{node.lineno}: {v!r}" for v in hits
                  if (path.name, v) not in _NAME_ALLOWED]
    return found


def test_no_rule_is_picked_by_a_function_name_outside_the_table() -> None:
    """Every st.numpy / st.nn function is built from its surface row by its binding (and its
    `dtypes` kind): a special case by name (`if name == "imag"`, `{"real": _real_imag}`) would
    be a second rule table that the plugin, the stubs and the docs do not read."""
    import pathlib

    names = {r.name for r in (*_surface.NUMPY, *_surface.NN)}
    # other vocabularies spelled like some function: binding, refinement and linearity kinds
    names -= {*_surface.FUNCTION_BINDINGS, "mean", "where", *_surface.REFINE_KINDS,
              *(k.value for k in _rules.Linearity)}
    root = pathlib.Path(snp.__file__).parent
    found = [f for m in _BUILT_FROM_THE_TABLE for f in _name_special_cases(root / m, names)]
    assert not found, found


def test_every_numpy_export_is_a_row_with_its_rule() -> None:
    """`st.numpy.<name>` exists exactly for the rows, each documented with its row's rule; a
    row's dtype dependence is a `_rules.DTYPE_KINDS` kind whose rule is a known rule."""
    for r in _surface.NUMPY:
        fn = getattr(snp, r.name)
        assert fn.__module__ == "spmdtyped.numpy" and f"rule `{r.rule}`" in (fn.__doc__ or ""), r
        if r.dtypes is not None:
            assert r.dtypes in _rules.DTYPE_KINDS, r
    assert {r.name for r in _surface.NUMPY if r.dtypes == "part"} == set(_rules.REAL_PARTS)
    # the static view (dtypes unknown) applies the row's rule
    for r in _surface.NUMPY:
        if r.dtypes is not None:
            assert _rules.dtype_rule(r.dtypes, str(r.rule), [(_rules.INVARIANT, _rules.UNKNOWN)],
                                     F, op="t") == r.rule

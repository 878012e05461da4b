"""The refinement tables of docs/refinement.md (Shard, Partial, Rep), generated from the rule
modules `spmdtyped._rules.refine` and `refine_shape`: every cell is a call of the rule the
runtime and the plugin call, printed. Loaded by docs/hooks.py (`GENERATORS["refine-..."]`,
`MESSAGE_TRIGGERS` of the refinement codes). Imports no JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spmdtyped import _errors, _surface
from spmdtyped._rules import LITERAL, SpmdType
from spmdtyped._rules import refine as rf
from spmdtyped._rules.refine import content as rc
from spmdtyped._rules.refine import shape as rs

AXIS = "tp"
TP = SpmdType(varying=AXIS)
INV = SpmdType()
SHAPE = (4, 8)

#: the operand kinds of the tables: label -> the rule's view of an operand of shape [4, 8]
OPERANDS: dict[str, rf.Arg] = {
    "Shard(-1)": rf.Arg(TP, rf.Refinement.of({AXIS: rf.Shard(-1)}, data=True), SHAPE),
    "Shard(-2)": rf.Arg(TP, rf.Refinement.of({AXIS: rf.Shard(-2)}, data=True), SHAPE),
    "Partial": rf.Arg(TP, rf.Refinement.of({AXIS: rf.PARTIAL}, data=True), SHAPE),
    "Rep": rf.Arg(TP, rf.Refinement.of({AXIS: rf.REP}, data=True), SHAPE),
    "plain Varying": rf.Arg(TP, rf.Refinement(data=True), SHAPE),
    "Invariant input": rf.Arg(INV, rf.Refinement(data=True), SHAPE),
    "Invariant [4, 1]": rf.Arg(INV, rf.Refinement(data=True), (4, 1)),
    "Invariant / st.axis_size('tp')": rf.Arg(INV, rf.with_share(rf.DATA, INV, (AXIS,)), SHAPE),
    "constant (zeros, ones)": rf.Arg(INV, rf.NONE, SHAPE),
    "literal": rf.Arg(LITERAL, rf.NONE, ()),
}


def _label(k: Any) -> str:
    if k is None or k == rf.PLAIN:
        return "plain"
    if k == rf.FIXED:
        return "Invariant"
    return str(k)


def _run(fn: Callable[..., rf.Refinement], code: Callable[[str], str], out: SpmdType = TP,
         *args: Any, **kwargs: Any) -> str:
    """The rule `fn(*args, **kwargs)`'s kind over 'tp' (or the code it raises)."""
    try:
        ref = fn(*args, **kwargs)
    except _errors.SpmdTypeError as e:
        return f"✗ {code(e.code)}"
    if AXIS not in out.varying:
        return "Invariant"
    return _label(ref.get(AXIS))


def _out(args: Sequence[rf.Arg]) -> SpmdType:
    return TP if any(isinstance(a.type, SpmdType) and AXIS in a.type.varying for a in args) else INV


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def gen_binary(code: Callable[[str], str], name: str = "add") -> str:
    """`a <name> b` for each pair of operand kinds (`refine.elementwise`), over 'tp'."""
    labels = list(OPERANDS)
    rows = []
    for left in labels:
        cells = [f"**{left}**"]
        for right in labels:
            args = [OPERANDS[left], OPERANDS[right]]
            out = _out(args)
            cells.append(_run(rf.elementwise, code, out, name, args, out, op=f"operator {name}",
                              out_ndim=2))
        rows.append(cells)
    return _table([f"`a {name} b`: a \\ b", *labels], rows)


UNARY = ("neg", "astype", "exp", "tanh", "sqrt", "abs")


def gen_unary(code: Callable[[str], str]) -> str:
    rows = []
    for label in ("Shard(-1)", "Partial", "Rep", "plain Varying"):
        x = OPERANDS[label]
        rows.append([f"**{label}**", *(_run(rf.elementwise, code, TP, n, [x], TP, op=n)
                                       for n in UNARY)])
    return _table(["operand", *(f"`{n}`" for n in UNARY)], rows)


REDUCTIONS = ("sum", "mean", "max", "argmax", "var")
ALONG = ("cumsum", "sort", "flip")


def gen_reductions(code: Callable[[str], str]) -> str:
    """Reductions and ops along one dim of a [4, 8] operand, over dim -1 and dim 0."""
    rows = []
    for label in ("Shard(-1)", "Partial", "Rep"):
        x = OPERANDS[label]
        for axis in (-1, 0):
            cells = [f"**{label}**, axis={axis}"]
            cells += [_run(rf.reduction, code, TP, n, TP, x.ref, TP, ndim=2, axis=axis, op=n)
                      for n in REDUCTIONS]
            cells += [_run(rf.along_dim, code, TP, n, TP, x.ref, TP, ndim=2, axis=axis, op=n)
                      for n in ALONG]
            cells.append(_run(rf.softmax, code, TP, "softmax", TP, x.ref, TP, ndim=2, axis=axis,
                              op="softmax"))
            rows.append(cells)
    names = [*REDUCTIONS, *ALONG, "st.nn.softmax"]
    return _table(["operand, dim", *(f"`{n}`" for n in names)], rows)


CONTRACTIONS: tuple[tuple[str, str, str], ...] = (
    ("h @ w2 (row-parallel)", "Shard(-1)", "Shard(-2)"),
    ("x @ w1 (column-parallel)", "Rep", "Shard(-1)"),
    ("x @ w1, x Invariant", "Invariant input", "Shard(-1)"),
    ("shard against a full dim", "Shard(-1)", "Invariant input"),
    ("batch shard @ weight", "Shard(-2)", "Invariant input"),
    ("partial @ replicated", "Partial", "Invariant input"),
    ("partial @ partial", "Partial", "Partial"),
)


def gen_contractions(code: Callable[[str], str]) -> str:
    rows = []
    for what, a, b in CONTRACTIONS:
        args = [OPERANDS[a], rf.Arg(OPERANDS[b].type, OPERANDS[b].ref, (8, 8))]
        rows.append([what, a, b, _run(rf.einsum, code, TP, rf.matmul_spec(2, 2), args, TP,
                                      op="operator @")])
    return _table(["`a @ b`", "a", "b", "result"], rows)


COLLECTIVES: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("st.psum(x, 'tp')", "psum", {}),
    ("st.pmean(x, 'tp')", "pmean", {}),
    ("st.pmax(x, 'tp')", "pmax", {}),
    ("st.psum_scatter(x, 'tp', scatter_dimension=1, tiled=True)", "psum_scatter",
     {"scatter_dimension": 1, "tiled": True}),
    ("st.all_gather(x, 'tp', axis=1, tiled=True)", "all_gather", {"axis": 1, "tiled": True}),
    ("st.all_to_all(x, 'tp', 0, 1, tiled=True)", "all_to_all",
     {"split_axis": 0, "concat_axis": 1, "tiled": True}),
    ("st.ppermute(x, 'tp', perm)", "ppermute", {}),
)

#: the four-state result of each collective over 'tp' of a Varying input
_RESULT = {"psum": INV, "pmean": INV, "pmax": INV}


def gen_collectives(code: Callable[[str], str]) -> str:
    rows = []
    for form, name, params in COLLECTIVES:
        out = _RESULT.get(name, TP)
        cells = [f"`{form}`"]
        refs = [OPERANDS["Shard(-1)"].ref, OPERANDS["Shard(-1)"].ref.with_grad(True),
                *(OPERANDS[label].ref for label in ("Partial", "Rep", "plain Varying"))]
        for ref in refs:
            cells.append(_run(rs.collective, code, out, name, TP, ref, out, (AXIS,),
                              shape=SHAPE, op=f"st.{name}", params=params))
        rows.append(cells)
    inv = OPERANDS["Invariant input"]
    rows.append(["`st.pvary(x, 'tp')` / `st.pcast(x, 'tp', to='varying')`", "", "", "", "",
                 f"Invariant → {_label(rs.collective('pvary', INV, inv.ref, TP, (AXIS,), op='st.pvary').get(AXIS))}"])
    rows.append(["`st.axis_index('tp')`", "", "", "", "", _label(rs.axis_index((AXIS,)).get(AXIS))])
    return _table(["collective", "Shard(-1)", "gradient of a Shard(-1)", "Partial", "Rep",
                   "plain Varying"], rows)


def gen_cotangents(code: Callable[[str], str]) -> str:
    rows = []
    for label in ("Shard(-1)", "Partial", "Rep", "plain Varying"):
        rows.append([label, _label(rs.cotangent(OPERANDS[label].ref).get(AXIS))])
    rows.append(["Invariant", "Invariant"])
    return _table(["primal over 'tp'", "cotangent"], rows)


def gen_surface(code: Callable[[str], str]) -> str:
    """Which refinement rule each Python form of the surface table uses (`Row.refine`)."""
    by_kind: dict[str, list[str]] = {}
    for row in _surface.ROWS:
        by_kind.setdefault(row.refine, [])
        if row.form not in by_kind[row.refine]:
            by_kind[row.refine].append(row.form)
    rows = [[f"`{k}`", ", ".join(f"`{f}`" for f in by_kind[k])]
            for k in _surface.REFINE_KINDS if k in by_kind]
    return _table(["refinement kind", "forms"], rows)


def _sh(d: int) -> rf.Refinement:
    return rf.Refinement.of({AXIS: rf.Shard(d)}, data=True)


#: rule calls that raise each refinement code, for the message shown on its error page
TRIGGERS: dict[str, Callable[[], object]] = {
    "SPMD108": lambda: rs.collective("psum", TP, _sh(0).with_grad(True), INV, (AXIS,), shape=(1, 4),
                                     op="st.psum"),
    "SPMD210": lambda: rf.elementwise("add", [OPERANDS["Partial"], OPERANDS["Invariant [4, 1]"]],
                                      TP, op="operator +"),
    "SPMD211": lambda: rf.elementwise("tanh", [OPERANDS["Partial"]], TP, op="st.numpy.tanh"),
    "SPMD212": lambda: rf.elementwise("div", [OPERANDS["Shard(-1)"], OPERANDS["Partial"]], TP,
                                      op="operator /"),
    "SPMD213": lambda: rf.elementwise("where", [OPERANDS["plain Varying"], OPERANDS["Partial"],
                                                OPERANDS["literal"]], TP, op="st.numpy.where",
                                      onehot_fill=True),
    "SPMD215": lambda: rf.elementwise("add", [OPERANDS["Shard(-2)"], OPERANDS["Invariant input"]],
                                      TP, op="operator +", out_ndim=2),
    "SPMD216": lambda: _raise(rc.diagonal_block("sp", (-2, -2), "dot_general")),
}


def _raise(e: Exception) -> None:
    """Raise `e` (a rule that builds its error for the engine to report later)."""
    raise e

GENERATORS: dict[str, Callable[..., str]] = {
    "refine-binary": gen_binary,
    "refine-unary": gen_unary,
    "refine-reductions": gen_reductions,
    "refine-contractions": gen_contractions,
    "refine-collectives": gen_collectives,
    "refine-cotangents": gen_cotangents,
    "refine-surface": gen_surface,
}

"""Parity of the runtime and the mypy plugin on every row of the surface table.

Every row of `spmdtyped._surface.ROWS` (operators with their reflected and literal positions,
unary operators, methods with their common arguments, properties, static and traced indexing,
`.at[]`, every `st.numpy` and `st.nn` function, every collective and cast with each `to=`
target) plus `st.axis_index` / `st.axis_size`, for every state of its operand(s) on the
(dp: 2, tp: 4) mesh (Invariant, Varying, Unreduced and Reduced on one axis, and mixed states
over both axes; for two or three operands every one of those next to an Invariant one, plus a
deterministic sample of mixed pairs drawn from all 16 states), goes through

- the runtime: evaluated inside one real `st.shard_map` (traced, never compiled), and
- mypy with `spmdtyped.mypy_plugin`: one generated module, one mypy run, a `reveal_type`
  per case,

and must give the same result: the same state, or the same error code (`spmd-<slug>`). Every
case of a function or collective row with a typed operand is checked once more in JAX's own
spelling of the form (`jnp.exp(x)`, `jax.nn.relu(x)`, `jax.lax.neg(x)`, `jax.lax.psum(x, "tp")`,
`_surface.JAX_FUNCTIONS`): mypy on that spelling against the runtime on the row's st form.
Forms without a state (`x.shape`, `st.axis_size`) must type-check without an error and not
be typed values. A runtime result that is not a state question (JAX's own dtype or shape
errors) is counted and must not be a row's only outcome. Every row must also have its static
declaration (`_static.py`, the `TYPE_CHECKING` blocks of `numpy.py` / `nn.py`).
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import itertools
import os
import random
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from _helpers import make_raw
from jax.sharding import PartitionSpec as P
from test_plugin_differential import _ERROR, _REVEAL, _jax_setting, _parse_static
from test_typing import CACHE, mypy_config, run_mypy

import spmdtyped as st
from spmdtyped import SpmdType, _rules, _surface
from spmdtyped._errors import REGISTRY, SpmdTypeError
from spmdtyped._typed.hints import SArray

AXES = ("dp", "tp")
SIZES = {"dp": 2, "tp": 4}
PKG = Path(st.__file__).parent
#: mixed pairs sampled per two-operand form, on top of every state next to an Invariant one
MIXED_PAIRS = 8


def _states() -> list[SpmdType]:
    out = []
    for combo in itertools.product("IVUR", repeat=len(AXES)):
        kw: dict[str, set[str]] = {"varying": set(), "unreduced": set(), "reduced": set()}
        for axis, s in zip(AXES, combo, strict=True):
            if s != "I":
                kw[{"V": "varying", "U": "unreduced", "R": "reduced"}[s]].add(axis)
        out.append(SpmdType(**kw))
    return out


ALL_STATES = _states()
INV = _rules.INVARIANT


def _state(v: str = "", u: str = "", r: str = "") -> SpmdType:
    return SpmdType(varying=set(v.split()), unreduced=set(u.split()), reduced=set(r.split()))


#: the states of one operand: Invariant, each state on one axis, and two mixed over (dp, tp)
STATES = [INV, _state(v="dp"), _state(v="tp"), _state(u="tp"), _state(r="tp"),
          _state(v="dp", u="tp"), _state(v="dp", r="tp"), _state(v="dp tp")]

# ------------------------------------------------------------------------------ the cases

#: operand kinds: dtype and local shape of the runtime value
KINDS: dict[str, tuple[Any, tuple[int, ...]]] = {
    "f": (jnp.float32, (8, 8)), "i": (jnp.int32, (8, 8)), "b": (jnp.bool_, (8, 8)),
    "c": (jnp.complex64, (8, 8)), "fs": (jnp.float32, ()), "is": (jnp.int32, ()),
    "iv": (jnp.int32, (4,)), "im": (jnp.int32, (8, 8)),
}


@dataclasses.dataclass(frozen=True)
class Case:
    row: int | None          # index into _surface.ROWS (None: axis_index/axis_size)
    expr: str                # source of the form, on the operands x, y, z
    operands: tuple[tuple[str, str, SpmdType], ...] = ()  # (name, kind, state)
    #: JAX's spelling of the same form (`jnp.exp(x)` for `st.numpy.exp(x)`): what mypy checks;
    #: the runtime evaluates `expr`, the row's own form (a raw jnp call has no checks to compare)
    static_expr: str | None = None

    def where(self) -> str:
        expr = self.static_expr or self.expr
        return f"{expr} with " + ", ".join(
            f"{n}: {_rules.hint_text(t, AXES)}" for n, _k, t in self.operands) if self.operands \
            else expr


def _pairs(form: str) -> list[tuple[SpmdType, SpmdType]]:
    """Every state next to an Invariant one (both sides), plus mixed pairs sampled by form."""
    base = [(s, INV) for s in STATES] + [(INV, s) for s in STATES[1:]]
    rest = [(a, b) for a in ALL_STATES[1:] for b in ALL_STATES[1:]]
    return base + random.Random(zlib.crc32(form.encode())).sample(rest, MIXED_PAIRS)


def _one(row: int, expr: str, kind: str = "f") -> list[Case]:
    return [Case(row, expr, (("x", kind, s),)) for s in STATES]


def _two(row: int, expr: str, kx: str = "f", ky: str = "f") -> list[Case]:
    return [Case(row, expr, (("x", kx, a), ("y", ky, b))) for a, b in _pairs(expr)]


_INT_OPS = {"and", "or", "xor"}
_CONTRACTIONS = {"matmul", "dot"}
#: unary st.numpy functions called with further arguments (besides `f(x)`)
_NUMPY_ARGS: dict[str, tuple[str, ...]] = {
    "reshape": ("x, (64,)",), "swapaxes": ("x, 0, 1",), "moveaxis": ("x, 0, 1",),
    "expand_dims": ("x, 0",), "broadcast_to": ("x, (2, 8, 8)",), "roll": ("x, 1",),
    "tile": ("x, 2",), "repeat": ("x, 2",), "pad": ("x, 1",), "cumsum": ("x", "x, axis=0"),
    "cumprod": ("x", "x, axis=1"), "sum": ("x", "x, axis=0", "x, axis=1, keepdims=True"),
    "max": ("x", "x, axis=0"), "min": ("x", "x, axis=0"), "mean": ("x", "x, axis=0"),
    "prod": ("x", "x, axis=0"), "var": ("x", "x, axis=0"), "std": ("x", "x, axis=0"),
    "argmax": ("x", "x, axis=0"), "transpose": ("x", "x, (1, 0)"),
}
_METHOD_ARGS: dict[str, tuple[str, ...]] = {
    "sum": ("", "axis=0", "0, keepdims=True"), "max": ("", "axis=1"), "min": ("", "axis=0"),
    "mean": ("", "axis=0"), "reshape": ("64", "(4, 16)"), "transpose": ("", "1, 0"),
    "astype": ('"float16"',), "squeeze": ("",), "ravel": ("",),
}
_NN_ARGS: dict[str, tuple[str, ...]] = {"softmax": ("x", "x, axis=0"),
                                        "log_softmax": ("x", "x, axis=-1"),
                                        "logsumexp": ("x", "x, axis=0")}
#: pcast / all_gather target of each AXIS_OPS row they apply
_TO = {**{_rules.pcast_op(t): t for t in _rules.PCAST_TARGETS},
       **{_rules.all_gather_op(t): t for t in _rules.ALL_GATHER_TARGETS}}
_AXIS_ARGS = ('"dp"', '"tp"', '("dp", "tp")')


def _axis_size(axis: str) -> int:
    n = 1
    for a in ast.literal_eval(axis) if axis.startswith("(") else (ast.literal_eval(axis),):
        n *= SIZES[a]
    return n


def _collective_call(name: str, op: str, axis: str) -> str:
    n = _axis_size(axis)
    extra = {
        "ppermute": f", perm={[(k, (k + 1) % n) for k in range(n)]}",
        "pshuffle": f", perm={[(k + 1) % n for k in range(n)]}",
        "pbroadcast": ", 0", "psum_scatter": ", tiled=True", "all_to_all": ", 0, 0, tiled=True",
    }.get(name, "")
    to = f", to={_TO[op]!r}" if op in _TO else ""
    return f"st.{name}(x, {axis}{extra}{to})"


def _numpy_cases(k: int, row: _surface.Row) -> list[Case]:
    f = f"st.{row.kind}.{row.name}"
    b = row.binding
    if row.kind == "nn":
        if row.name == "one_hot":
            return _one(k, f"{f}(x, 8)", "i")
        return [c for a in _NN_ARGS.get(row.name, ("x",)) for c in _one(k, f"{f}({a})")]
    if b == "unary" and row.name.startswith("logical"):
        return _one(k, f"{f}(x)", "b")
    if b == "binary" and row.name.startswith("logical"):
        return _two(k, f"{f}(x, y)", "b", "b")
    if row.name in ("real", "imag"):
        # the row's rule is the complex one; of a real array JAX binds no primitive (real is the
        # array, imag zeros_like), a dtype the static view does not see
        return _one(k, f"{f}(x)", "c")
    if b in ("unary", "mean"):
        return [c for a in _NUMPY_ARGS.get(row.name, ("x",)) for c in _one(k, f"{f}({a})")]
    if b == "binary" and row.rule in _CONTRACTIONS:
        return _two(k, f"{f}(x, y)")
    if b == "binary":
        return [*_two(k, f"{f}(x, y)"), *_one(k, f"{f}(x, 2)"), *_one(k, f"{f}(2.0, x)")]
    if b == "join":
        return _two(k, f"{f}([x, y])")
    if b == "einsum":
        return [*_two(k, f'{f}("ij,jk->ik", x, y)'), *_one(k, f'{f}("ij->j", x)')]
    if b == "where":
        three = [Case(k, f"{f}(z, x, y)", (("z", "b", c), ("x", "f", a), ("y", "f", bb)))
                 for (a, bb), c in zip(_pairs(f), itertools.cycle(STATES), strict=False)]
        return [*three, *[Case(k, f"{f}(z, x, 0.0)", (("z", "b", c), ("x", "f", INV)))
                          for c in STATES]]
    if b == "take" and row.name == "take_along_axis":  # an index of the array's rank
        return [Case(k, f"{f}(x, y, axis=-1)", (("x", "f", a), ("y", "im", bb)))
                for a, bb in _pairs(f)]
    if b == "take":
        return [*[Case(k, f"{f}(x, y)", (("x", "f", a), ("y", "iv", bb))) for a, bb in _pairs(f)],
                *_one(k, f"{f}(x, 0)"), *_one(k, f"{f}(x, -1)")]
    if b == "slice":
        return [*[Case(k, f"{f}(x, y, 2, 1)", (("x", "f", a), ("y", "is", bb)))
                  for a, bb in _pairs(f)], *_one(k, f"{f}(x, 1, 2)")]
    if b == "split":  # the first piece (every piece has the same state)
        return [*_one(k, f"{f}(x, 2)[0]"), *_one(k, f"{f}(x, 4, axis=1)[1]")]
    if b == "like":
        if row.name == "full_like":
            return [*_one(k, f"{f}(x, 2.0)"),
                    *[Case(k, f"{f}(x, y)", (("x", "f", a), ("y", "fs", bb))) for a, bb in _pairs(f)]]
        return _one(k, f"{f}(x)")
    if b == "new":
        args = {"arange": "8", "linspace": "0.0, 1.0, 8", "eye": "8"}.get(row.name, "(8, 8)")
        if row.name == "full":
            return [Case(k, f"{f}((8, 8), 2.0)"),
                    *[Case(k, f"{f}((8, 8), y)", (("y", "fs", s),)) for s in STATES]]
        if row.name == "linspace":  # traced bounds flow into every element
            return [Case(k, f"{f}({args})"),
                    *[Case(k, f"{f}(y, 1.0, 8)", (("y", "fs", s),)) for s in STATES],
                    *[Case(k, f"{f}(0.0, stop=y, num=8)", (("y", "fs", s),)) for s in STATES]]
        return [Case(k, f"{f}({args})")]
    raise AssertionError(f"no cases for the binding {b!r} of {row.form}")


def cases() -> list[Case]:
    out: list[Case] = []
    for k, row in enumerate(_surface.ROWS):
        if row.kind == "operator":
            kind = "i" if row.rule in _INT_OPS else "f"
            sym = row.symbol
            out += _two(k, f"x {sym} y", kind, kind)
            if row.rule in _CONTRACTIONS:  # a Python scalar has no dimension to contract
                continue
            out += _one(k, f"x {sym} 2", kind) + _one(k, f"2 {sym} x", kind)
            if kind == "f":
                out += _one(k, f"x {sym} 0.5") + _one(k, f"0.5 {sym} x")
        elif row.kind == "unary_operator":
            expr = "abs(x)" if row.symbol is None else f"{row.symbol}x"
            out += _one(k, expr, "i" if row.symbol == "~" else "f")
            if row.symbol == "~":
                out += _one(k, expr, "b")
        elif row.kind == "method":
            out += [c for a in _METHOD_ARGS[row.name] for c in _one(k, f"x.{row.name}({a})")]
        elif row.kind == "property":
            out += _one(k, f"x.{row.name}")
        elif row.kind == "index" and row.arity == 1:
            out += [c for e in ("x[0]", "x[1:3]", "x[0, :]", "x[:, 2]", "x[None]")
                    for c in _one(k, e)]
        elif row.kind == "index":
            out += [Case(k, "x[y]", (("x", "f", a), ("y", "is", b))) for a, b in _pairs("x[y]")]
            out += [Case(k, "x[y, 0]", (("x", "f", a), ("y", "is", b))) for a, b in _pairs("x[y,0]")]
        elif row.kind == "at":
            m = row.name
            out += _two(k, f"x.at[:].{m}(y)") + _one(k, f"x.at[0].{m}(2.0)")
            out += [Case(k, f"x.at[0, 1].{m}(y)", (("x", "f", a), ("y", "fs", b)))
                    for a, b in _pairs(f"at[0,1].{m}")]
        elif row.kind in ("numpy", "nn"):
            out += _numpy_cases(k, row)
        elif row.kind == "collective":
            out += [c for axis in _AXIS_ARGS
                    for c in _one(k, _collective_call(row.name, row.rule or "", axis))]
        else:
            raise AssertionError(f"no cases for the row kind {row.kind!r} ({row.form})")
    # the collectives without a typed operand
    for c in _surface.COLLECTIVES:
        if not c.ops:
            out += [Case(None, f"st.{c.name}({axis})") for axis in _AXIS_ARGS]
    return out + jax_spellings(out)


#: JAX's module of each public prefix, as the generated module imports it
_JAX_SHORT = {"jax.numpy.": "jnp.", "jax.nn.": "jax.nn.", "jax.lax.": "jax.lax."}


def _jax_spelling(row: _surface.Row) -> list[str]:
    """JAX's spellings of a row's form (`jnp.exp`; `jax.lax.neg` for `st.numpy.negative`) that
    this JAX has."""
    out = []
    for full, r in _surface.JAX_FUNCTIONS.items():
        if r is not row:
            continue
        module, _, name = full.rpartition(".")
        if hasattr({"jax.numpy": jnp, "jax.nn": jax.nn, "jax.lax": jax.lax}[module], name):
            out.append(_JAX_SHORT[module + "."] + name)
    return sorted(out)


def jax_spellings(st_cases: list[Case]) -> list[Case]:
    """Every case of an st.numpy / st.nn / collective row with a typed operand, once more in
    each of JAX's spellings of its form (the runtime evaluates the st form)."""
    out = []
    for case in st_cases:
        if case.row is None or not case.operands:
            continue  # no typed argument: JAX's own result (plain), by design
        row = _surface.ROWS[case.row]
        if row.kind in ("numpy", "nn"):
            prefix = f"st.{row.kind}.{row.name}("
            out += [dataclasses.replace(case, static_expr=case.expr.replace(prefix, f"{j}(", 1))
                    for j in _jax_spelling(row)]
        elif row.kind == "collective" and hasattr(jax.lax, row.name):
            out.append(dataclasses.replace(
                case, static_expr=case.expr.replace(f"st.{row.name}(", f"jax.lax.{row.name}(", 1)))
    return out


# ------------------------------------------------------------------------------ the runtime

_NOT_TYPED = "no state"


def _value(kind: str, t: SpmdType) -> Any:
    """A typed value of `kind` in state `t`, made from an Invariant constant by free casts."""
    dtype, shape = KINDS[kind]
    return st.wrap(make_raw(jnp.ones(shape, dtype), t))


def _runtime_one(case: Case, values: dict[tuple[str, SpmdType], Any]) -> tuple[Any, bool]:
    """(outcome, whether check mode found the table disagreeing with JAX: SPMD901)."""
    env: dict[str, Any] = {"st": st}
    for name, kind, t in case.operands:
        if (kind, t) not in values:
            try:
                values[(kind, t)] = _value(kind, t)
            except Exception as e:  # noqa: BLE001 - JAX cannot make this value
                values[(kind, t)] = e
        v = values[(kind, t)]
        if isinstance(v, Exception):
            return f"value: {type(v).__name__}", False
        env[name] = v
    try:
        out = eval(case.expr, env)  # noqa: S307 - our own generated forms
    except SpmdTypeError as e:
        if e.code != "SPMD901":
            return e.code, False
        with st.check_mode(False):  # the table's own prediction
            out, _ = _runtime_one(case, values)
        return out, True
    except Exception as e:  # noqa: BLE001 - JAX's own limits: not a state question
        return f"jax: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}", False
    return (st.typeof(out) if isinstance(out, SArray) else _NOT_TYPED), False


def run_runtime(all_cases: list[Case], mesh: Any) -> tuple[list[Any], int]:
    results: list[Any] = [None] * len(all_cases)
    disagreements_with_jax = [0]

    def body(c: Any) -> Any:
        values: dict[tuple[str, SpmdType], Any] = {}
        for n, case in enumerate(all_cases):
            results[n], with_jax = _runtime_one(case, values)
            disagreements_with_jax[0] += with_jax
        return c

    f = st.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())
    jax.eval_shape(f, jax.ShapeDtypeStruct((8,), jnp.float32))
    return results, disagreements_with_jax[0]


# ------------------------------------------------------------------------------ mypy


def run_static(all_cases: list[Case]) -> list[tuple[list[str], list[str], str | None]]:
    """(spmd codes, other errors, revealed type) of each case, from one mypy run."""
    lines = ["import jax", "import jax.numpy as jnp", "import spmdtyped as st",
             "from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying", ""]
    at: dict[int, int] = {}
    for n, case in enumerate(all_cases):
        params = ", ".join(f"{name}: {_rules.hint_text(t, AXES)}" for name, _k, t in case.operands)
        lines += [f"def case_{n}({params}) -> None:",
                  f"    reveal_type({case.static_expr or case.expr})", ""]
        at[len(lines) - 1] = n
    tmp = Path(tempfile.mkdtemp(prefix="spmdtyped-parity-"))
    (tmp / "parity.py").write_text("\n".join(lines) + "\n")
    cfg = mypy_config(tmp, plugin=True, extra=f"[spmdtyped]\njax = {_jax_setting()}\n")
    _, out = run_mypy([tmp / "parity.py"], cfg, CACHE / "parity", cwd=tmp)
    static: list[tuple[list[str], list[str], str | None]] = [([], [], None) for _ in all_cases]
    for line in out.splitlines():
        if (m := _REVEAL.match(line)) and int(m.group("line")) in at:
            n = at[int(m.group("line"))]
            static[n] = (static[n][0], static[n][1], m.group("type"))
        elif (m := _ERROR.match(line)) and int(m.group("line")) in at:
            n = at[int(m.group("line"))]
            code = m.group("code")
            (static[n][0] if code.startswith("spmd") else static[n][1]).append(
                code if code.startswith("spmd") else f"[{code}] {m.group('msg')}")
    return static


# ------------------------------------------------------------------------------ the test


def compare(case: Case, rt: Any, static: tuple[list[str], list[str], str | None]) -> tuple[str, str | None]:
    """(the outcome's category, a disagreement or None)."""
    codes, others, revealed = static
    if others:
        return "disagree", f"{case.where()}: mypy reports {others}; runtime {rt}"
    if isinstance(rt, str) and rt.startswith(("jax:", "value:")):
        return "runtime: not a state question", None
    if rt == _NOT_TYPED:
        if codes or (revealed or "").startswith("spmdtyped._static.SArray"):
            return "disagree", f"{case.where()}: runtime has no state; plugin {codes or revealed}"
        return "both: no state", None
    if isinstance(rt, str):
        want = f"spmd-{REGISTRY[rt].slug}"
        if codes == [want]:
            return "both reject", None
        return "disagree", f"{case.where()}: runtime {rt} ({want}); plugin {codes or revealed}"
    precise = _parse_static(revealed) if revealed else None
    x_reduced = any(n == "x" and t.reduced for n, _k, t in case.operands)
    if not codes and revealed == _NO_CLAIM and case.expr.startswith("x[y") and x_reduced:
        # a typed index of unknown rank: a scalar slices (Reduced kept), an array gathers (jax
        # 0.10 drops Reduced); the plugin checks the rule and makes no claim (documented gap)
        return "plugin: no claim (index rank unknown)", None
    if codes or precise != rt:
        return "disagree", f"{case.where()}: runtime {rt}; plugin {codes or revealed}"
    return "same state", None


#: what mypy reveals when the plugin makes no claim about a result
_NO_CLAIM = "spmdtyped._static.SArray[Any, Any, Any, Any]"


def test_runtime_and_plugin_agree_on_every_row(mesh_dp_tp: Any) -> None:
    all_cases = cases()
    t0 = time.perf_counter()
    runtime, with_jax = run_runtime(all_cases, mesh_dp_tp)
    t1 = time.perf_counter()
    static = run_static(all_cases)
    t2 = time.perf_counter()

    stats: collections.Counter[str] = collections.Counter()
    by_row: dict[int | None, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    problems: list[str] = []
    for case, rt, s in zip(all_cases, runtime, static, strict=True):
        category, problem = compare(case, rt, s)
        stats[category] += 1
        by_row[case.row][category] += 1
        if problem:
            problems.append(problem)
    forms = len(_surface.ROWS) + sum(1 for c in _surface.COLLECTIVES if not c.ops)
    spelled = sum(1 for c in all_cases if c.static_expr)
    print(f"\nparity: {forms} forms, {len(all_cases)} cases ({spelled} in JAX's spelling): "
          f"{dict(stats)}; "
          f"{with_jax} cases where the table disagrees with JAX (SPMD901, compared on the "
          f"table's prediction); runtime {t1 - t0:.1f}s, mypy {t2 - t1:.1f}s")
    if os.environ.get("SPMDTYPED_PARITY_DUMP"):
        Path(os.environ["SPMDTYPED_PARITY_DUMP"]).write_text("\n".join(
            [*problems, "--- not a state question ---",
             *(f"{c.where()}: {rt}" for c, rt in zip(all_cases, runtime, strict=True)
               if isinstance(rt, str) and rt.startswith(("jax:", "value:")))]))
    missing = [r.form for k, r in enumerate(_surface.ROWS) if k not in by_row]
    assert not missing, f"rows without a case: {missing}"
    no_outcome = [_surface.ROWS[k].form if k is not None else "axis_index/axis_size"
                  for k, c in by_row.items()
                  if not (c["same state"] + c["both reject"] + c["both: no state"])]
    assert not no_outcome, f"rows whose every case failed for a non-state reason: {no_outcome}"
    assert not problems, f"{len(problems)} disagreements:\n" + "\n".join(problems)


# ------------------------------------------------------------------------------ static forms


def _class_members(tree: ast.Module, cls: str) -> set[str]:
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {n.name for n in node.body if isinstance(n, ast.FunctionDef)}


def _type_checking_names(path: Path) -> set[str]:
    """Names declared in the module's `if TYPE_CHECKING:` blocks, and its plain definitions."""
    tree = ast.parse(path.read_text())
    out = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            out |= {n.target.id for n in node.body
                    if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return out


def test_every_row_has_a_static_form() -> None:
    static = ast.parse((PKG / "_static.py").read_text())
    sarray, at_index = _class_members(static, "SArray"), _class_members(static, "_AtIndex")
    missing = []
    for row in _surface.ROWS:
        if row.kind in ("operator", "unary_operator", "method", "property", "index"):
            names = {row.name} | ({row.reflected} if row.reflected else set())
            missing += [f"SArray.{n} ({row.form})" for n in sorted(names - sarray)]
        elif row.kind == "at":
            missing += [] if row.name in at_index else [f"_AtIndex.{row.name} ({row.form})"]
        elif row.kind in ("numpy", "nn"):
            declared = _type_checking_names(PKG / f"{row.kind}.py")
            missing += [] if row.name in declared else [f"{row.kind}.{row.name} ({row.form})"]
    all_names = next(ast.literal_eval(n.value) for n in static.body if isinstance(n, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    defined = {n.name for n in static.body if isinstance(n, ast.FunctionDef)}
    missing += [f"st.{n} (collective)" for n in _surface.COLLECTIVE_NAMES
                if n not in all_names or n not in defined]
    assert not missing, f"surface rows with no static form: {missing}"

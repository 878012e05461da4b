"""Random straight-line SPMD programs, renderable as typed spmdtyped code, raw JAX code and text.

Used by `test_differential.py` (spmdtyped against JAX itself) and reusable by the mypy-plugin
tests: `render_source(program)` gives a self-contained Python module.

A `Program` is plain data: a mesh, the inputs (each with its `in_specs` entry), a list of
`Step`s and the output with its `out_specs` entry. Value `v{n}` is input `n` for
`n < len(inputs)`, else the result of step `n - len(inputs)`.

Every step kind has ONE template per flavour (`TEMPLATES[kind] = (typed, raw)`); the executed
programs and the rendered source are both made from these strings, so they cannot drift:

- flavour ``"typed"``: spmdtyped's API (`st.psum`, typed operators, `snp.exp` = the typed
  numpy, `x.sum(axis=0)` typed methods);
- flavour ``"raw"``: the same program written against `jax.lax` / `jax.numpy` for
  `jax.shard_map`.

`render_source(program, flavor="typed")` returns a module defining `mesh`, `args` (abstract
`jax.ShapeDtypeStruct` arguments carrying their shardings) and `program` (the shard_map'd
function, decorated), plus `TRACE = jax.jit(program).trace(*args)` when ``trace=True``.
`expr(step, flavor)` is the right-hand side of one step.

This module imports no JAX: generation steers with `spmdtyped._rules` (pure Python) so that
most programs get deep before the first error; the steering never decides a test's outcome.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as hst

from spmdtyped import _rules, _surface
from spmdtyped._errors import SpmdTypeError

AXIS_NAMES = ("i", "j", "k")
#: meshes of 1 to 3 axes over 8 simulated CPU devices
MESHES: tuple[tuple[int, ...], ...] = ((8,), (2, 4), (4, 2), (2, 2, 2))
MAX_ELEMENTS = 2048
LITERALS = (2.0, 0.5, 3)

# ---------------------------------------------------------------------------------------------
# Data


@dataclasses.dataclass(frozen=True)
class Spec:
    """A PartitionSpec as data: per-dimension axes (None or a tuple), reduced, unreduced."""

    partitions: tuple[tuple[str, ...] | None, ...] = ()
    reduced: tuple[str, ...] = ()
    unreduced: tuple[str, ...] = ()

    def source(self) -> str:
        parts = []
        for p in self.partitions:
            if p is None:
                parts.append("None")
            elif len(p) == 1:
                parts.append(repr(p[0]))
            else:
                parts.append(repr(p))
        while parts and parts[-1] == "None":
            parts.pop()
        if self.reduced:
            parts.append("reduced={" + ", ".join(repr(a) for a in self.reduced) + "}")
        if self.unreduced:
            parts.append("unreduced={" + ", ".join(repr(a) for a in self.unreduced) + "}")
        return "P(" + ", ".join(parts) + ")"

    def partitioned_axes(self) -> tuple[str, ...]:
        return tuple(a for p in self.partitions if p for a in p)

    def hint(self) -> str:
        """The spmdtyped hint of a value entering with this in_spec (from the spec alone)."""
        parts = []
        for family, axes in (("Varying", self.partitioned_axes()), ("Unreduced", self.unreduced),
                             ("Reduced", self.reduced)):
            if axes:
                parts.append(f"st.{family}[{', '.join(repr(a) for a in axes)}]")
        if not parts:
            return "st.Invariant"
        return parts[0] if len(parts) == 1 else f"st.Typed[{', '.join(parts)}]"


@dataclasses.dataclass(frozen=True)
class Input:
    local_shape: tuple[int, ...]
    spec: Spec

    def global_shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        out = []
        for d, n in enumerate(self.local_shape):
            p = self.spec.partitions[d] if d < len(self.spec.partitions) else None
            out.append(n * math.prod(sizes[a] for a in (p or ())))
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class Step:
    kind: str
    args: tuple[int, ...]
    params: tuple[tuple[str, Any], ...] = ()

    def p(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)


@dataclasses.dataclass(frozen=True)
class Program:
    mesh_shape: tuple[int, ...]
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    out: int
    out_spec: Spec

    @property
    def axis_names(self) -> tuple[str, ...]:
        return AXIS_NAMES[: len(self.mesh_shape)]

    @property
    def sizes(self) -> dict[str, int]:
        return dict(zip(self.axis_names, self.mesh_shape, strict=True))

    def value_name(self, n: int) -> str:
        return f"v{n}"

    def kinds(self) -> list[str]:
        return [s.kind for s in self.steps]


# ---------------------------------------------------------------------------------------------
# Templates: (typed, raw). Placeholders: {a} {b} {c} (argument names) and the step's params.

_COLL = ("psum", "pmean", "pmax", "pmin")
TEMPLATES: dict[str, tuple[str, str]] = {
    **{k: (f"st.{k}({{a}}, {{axes}})", f"lax.{k}({{a}}, {{axes}})") for k in _COLL},
    "ppermute": ("st.ppermute({a}, {axes}, perm={perm})", "lax.ppermute({a}, {axes}, perm={perm})"),
    "pshuffle": ("st.pshuffle({a}, {axes}, perm={perm})", "lax.pshuffle({a}, {axes}, perm={perm})"),
    "pbroadcast": ("st.pbroadcast({a}, {axes}, source=0)", "lax.pbroadcast({a}, {axes}, source=0)"),
    "all_gather": ("st.all_gather({a}, {axes}, axis={axis}, tiled={tiled})",
                   "lax.all_gather({a}, {axes}, axis={axis}, tiled={tiled})"),
    "all_gather_invarying": ("st.all_gather({a}, {axes}, axis={axis}, tiled={tiled}, to='invarying')",
                             "lax.all_gather({a}, {axes}, axis={axis}, tiled={tiled}, to='invarying')"),
    "all_gather_reduced": ("st.all_gather({a}, {axes}, axis={axis}, tiled={tiled}, to='reduced')",
                           "lax.all_gather({a}, {axes}, axis={axis}, tiled={tiled}, to='reduced')"),
    "psum_scatter": ("st.psum_scatter({a}, {axes}, scatter_dimension={dim}, tiled={tiled})",
                     "lax.psum_scatter({a}, {axes}, scatter_dimension={dim}, tiled={tiled})"),
    "all_to_all": ("st.all_to_all({a}, {axes}, {split}, {concat}, tiled=True)",
                   "lax.all_to_all({a}, {axes}, {split}, {concat}, tiled=True)"),
    "axis_index": ("st.axis_index({axes})", "lax.axis_index({axes})"),
    "pvary": ("st.pvary({a}, {axes})", "pvary({a}, {axes})"),
    "pcast_varying": ("st.pcast({a}, {axes}, to='varying')", "lax.pcast({a}, {axes}, to='varying')"),
    "pcast_reduced": ("st.pcast({a}, {axes}, to='reduced')", "lax.pcast({a}, {axes}, to='reduced')"),
    "pcast_unreduced": ("st.pcast({a}, {axes}, to='unreduced')",
                        "lax.pcast({a}, {axes}, to='unreduced')"),
    "add": ("{a} + {b}", "{a} + {b}"),
    "sub": ("{a} - {b}", "{a} - {b}"),
    "mul": ("{a} * {b}", "{a} * {b}"),
    "div": ("{a} / {b}", "{a} / {b}"),
    "matmul": ("{a} @ {b}", "{a} @ {b}"),
    "lt": ("{a} < {b}", "{a} < {b}"),
    "gt": ("{a} > {b}", "{a} > {b}"),
    "lit": ("{lhs} {op} {rhs}", "{lhs} {op} {rhs}"),
    "neg": ("-{a}", "-{a}"),
    "exp": ("snp.exp({a})", "jnp.exp({a})"),
    "tanh": ("snp.tanh({a})", "jnp.tanh({a})"),
    "jnp_raw": ("st.wrap(jnp.{fn}(st.unwrap({a})))", "jnp.{fn}({a})"),
    "sum": ("{a}.sum(axis={axis})", "jnp.sum({a}, axis={axis})"),
    "mean": ("{a}.mean(axis={axis})", "jnp.mean({a}, axis={axis})"),
    "max": ("{a}.max(axis={axis})", "jnp.max({a}, axis={axis})"),
    "reshape": ("{a}.reshape({shape})", "{a}.reshape({shape})"),
    "transpose": ("{a}.T", "{a}.T"),
    "getitem": ("{a}[{idx}]", "{a}[{idx}]"),
    "dyn_getitem": ("{a}[{b}]", "{a}[{b}]"),
    "index_by_axis": ("{a}[st.axis_index({axes})]", "{a}[lax.axis_index({axes})]"),
    "cumsum": ("snp.cumsum({a}, axis={axis})", "jnp.cumsum({a}, axis={axis})"),
    "pow2": ("{a} ** 2", "{a} ** 2"),
    "flip": ("snp.flip({a}, axis={axis})", "jnp.flip({a}, axis={axis})"),
    "where": ("snp.where({a}, {b}, {c})", "jnp.where({a}, {b}, {c})"),
    "where_cmp": ("snp.where({a} < {b}, {c}, {d})", "jnp.where({a} < {b}, {c}, {d})"),
    "snp_unary": ("snp.{fn}({a})", "{jax_fn}({a})"),
    "snp_binary": ("snp.{fn}({a}, {b})", "{jax_fn}({a}, {b})"),
    "snp_call": ("snp.{fn}({a}{extra})", "{jax_fn}({a}{extra})"),
    "concatenate": ("snp.concatenate([{a}, {b}], axis={axis})",
                    "jnp.concatenate([{a}, {b}], axis={axis})"),
    "einsum": ("snp.einsum('ij,jk->ik', {a}, {b})", "jnp.einsum('ij,jk->ik', {a}, {b})"),
}
#: issue 12: argument-dependent rules and secondary arguments (drawn by the plugin differential;
#: not in `KINDS`, so the JAX differential's sample is unchanged)
ARGUMENT_TEMPLATES: dict[str, tuple[str, str]] = {
    "roll_by_axis": ("snp.roll({a}, st.axis_index({sec}), axis=0)",
                     "jnp.roll({a}, lax.axis_index({sec}), axis=0)"),
    "at_set_by_axis": ("{a}.at[st.axis_index({sec})].set(2.0)",
                       "{a}.at[lax.axis_index({sec})].set(2.0)"),
    "at_add_value": ("{a}.at[0].add({b})", "{a}.at[0].add({b})"),
    "pad_const": ("snp.pad({a}, 1, constant_values={lit})", "jnp.pad({a}, 1, constant_values={lit})"),
    "pad_mode": ("snp.pad({a}, 1, mode={mode!r})", "jnp.pad({a}, 1, mode={mode!r})"),
    "pad_by_value": ("snp.pad({a}, 1, constant_values={b})", "jnp.pad({a}, 1, constant_values={b})"),
    "astype_to": ("{a}.astype(jnp.{dt})", "{a}.astype(jnp.{dt})"),
    "sum_dtype": ("snp.sum({a}, dtype=jnp.int32)", "jnp.sum({a}, dtype=jnp.int32)"),
    "sum_initial": ("snp.sum({a}, axis=0, initial=1.0)", "jnp.sum({a}, axis=0, initial=1.0)"),
}
ARGUMENT_KINDS: tuple[str, ...] = tuple(ARGUMENT_TEMPLATES)
TEMPLATES.update(ARGUMENT_TEMPLATES)
#: kinds that are collectives or casts (everything with an `axes` param)
AXIS_KINDS = frozenset(k for k, (t, _) in TEMPLATES.items() if "{axes}" in t) - {"index_by_axis"}
#: kinds whose result does not lower on CPU (tracing only)
NO_CPU_LOWERING = frozenset({"pbroadcast"})


#: st.numpy name -> its JAX function's full name (the surface rows)
_NUMPY_JAX_NAMES = {row.name: row.jax for row in _surface.NUMPY}


def _raw_spelling(name: str) -> str:
    """The raw source spelling of `st.numpy.<name>`'s JAX function, from its surface row
    (`jnp.exp`; `lax.rsqrt`, which jax.numpy lacks)."""
    jax_name = _NUMPY_JAX_NAMES[name]
    for prefix, alias in (("jax.numpy.", "jnp."), ("jax.lax.", "lax.")):
        if jax_name.startswith(prefix):
            return alias + jax_name.removeprefix(prefix)
    raise AssertionError(f"no raw spelling for {jax_name}")


def expr(program: Program, step: Step, flavor: str = "typed") -> str:
    """The right-hand side of `step` as Python source, for flavour "typed" or "raw"."""
    template = TEMPLATES[step.kind][0 if flavor == "typed" else 1]
    names = [program.value_name(a) for a in step.args]
    fields: dict[str, Any] = dict(zip("abcd", names, strict=False))
    for key, value in step.params:
        fields[key] = repr(value) if key in ("axes", "sec") else value
    if "fn" in fields:
        fields["jax_fn"] = _raw_spelling(fields["fn"])
    if step.kind == "lit":
        lit = repr(step.p("literal"))
        fields["lhs"], fields["rhs"] = (lit, names[0]) if step.p("literal_first") else (names[0], lit)
    return template.format(**fields)


# ---------------------------------------------------------------------------------------------
# Rendering a whole program as source


def _dtype_source(program: Program) -> str:
    return "jnp.float32"


def render_source(program: Program, flavor: str = "typed", *, trace: bool = True,
                  annotate: bool = True) -> str:
    """A self-contained Python module for `program`.

    - ``flavor="typed"``: `@st.shard_map` over a function whose parameters are annotated with
      the hints their in_specs give (`st.Varying['i']`, ...; ``annotate=False`` drops them),
      using `st.*` collectives, typed operators and `snp` (= `spmdtyped.numpy` when present).
    - ``flavor="raw"``: `@jax.shard_map` with `jax.lax` / `jax.numpy`.

    The module defines `mesh`, `args` (`jax.ShapeDtypeStruct`s carrying the input shardings)
    and `program`; with ``trace=True`` it ends with `TRACE = jax.jit(program).trace(*args)`.
    Needs 8 devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`) when traced.
    """
    typed = flavor == "typed"
    sizes = program.sizes
    lines = [
        "import jax",
        "import jax.numpy as jnp",
        "from jax import lax",
        "from jax.sharding import NamedSharding",
        "from jax.sharding import PartitionSpec as P",
    ]
    if typed:
        lines += ["import spmdtyped as st", "import spmdtyped.numpy as snp"]
    else:
        lines += ["from jax._src.core import pvary  # JAX's own pvary (I -> V only; private)"]
    lines += [
        "",
        f"mesh = jax.make_mesh({program.mesh_shape!r}, {program.axis_names!r})",
        "args = (",
    ]
    for inp in program.inputs:
        lines.append(f"    jax.ShapeDtypeStruct({inp.global_shape(sizes)!r}, {_dtype_source(program)}, "
                     f"sharding=NamedSharding(mesh, {inp.spec.source()})),")
    lines.append(")")
    lines.append("")
    in_specs = "(" + ", ".join(i.spec.source() for i in program.inputs) + ",)"
    deco = "st.shard_map" if typed else "jax.shard_map"
    lines.append(f"@{deco}(mesh=mesh, in_specs={in_specs}, out_specs={program.out_spec.source()})")
    params = []
    for n, inp in enumerate(program.inputs):
        ann = f": {inp.spec.hint()}" if typed and annotate else ""
        params.append(f"{program.value_name(n)}{ann}")
    lines.append(f"def program({', '.join(params)}):")
    base = len(program.inputs)
    for k, step in enumerate(program.steps):
        lines.append(f"    {program.value_name(base + k)} = {expr(program, step, flavor)}")
    lines.append(f"    return {program.value_name(program.out)}")
    if trace:
        lines += ["", "", "TRACE = jax.jit(program).trace(*args)"]
    return "\n".join(lines) + "\n"


def describe(program: Program) -> str:
    """A short human-readable listing (for failure messages)."""
    return render_source(program, "typed", trace=False) + "# raw:\n" + "\n".join(
        f"#   v{len(program.inputs) + k} = {expr(program, s, 'raw')}"
        for k, s in enumerate(program.steps))


# ---------------------------------------------------------------------------------------------
# Shapes and dtypes


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    shape: tuple[int, ...]
    dtype: str                    # "f" float32, "i" int32, "b" bool
    type: _rules.SpmdType | None  # spmdtyped's predicted state (steering only); None = unknown


def _n(axes: Any, sizes: dict[str, int]) -> int:
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(sizes[a] for a in axes)


def result_shape(step: Step, shapes: Sequence[tuple[int, ...]],
                 sizes: dict[str, int]) -> tuple[int, ...] | None:
    """The local result shape, or None if the step is shape-invalid (never generated)."""
    k = step.kind
    s = shapes[0] if shapes else ()
    if k == "axis_index":
        return ()
    if k in AXIS_KINDS and k not in ("all_gather", "all_gather_invarying", "all_gather_reduced",
                                     "psum_scatter", "all_to_all"):
        return s
    if k.startswith("all_gather"):
        n, ax, tiled = _n(step.p("axes"), sizes), step.p("axis"), step.p("tiled")
        if tiled:
            if not s or ax >= len(s):
                return None
            out = s[:ax] + (s[ax] * n,) + s[ax + 1:]
        else:
            if ax > len(s):
                return None
            out = s[:ax] + (n,) + s[ax:]
        return out if math.prod(out) <= MAX_ELEMENTS else None
    if k == "psum_scatter":
        n, d, tiled = _n(step.p("axes"), sizes), step.p("dim"), step.p("tiled")
        if d >= len(s):
            return None
        if tiled:
            return s[:d] + (s[d] // n,) + s[d + 1:] if s[d] % n == 0 else None
        return s[:d] + s[d + 1:] if s[d] == n else None
    if k == "all_to_all":
        n, sp, cc = _n(step.p("axes"), sizes), step.p("split"), step.p("concat")
        if sp >= len(s) or cc >= len(s) or s[sp] % n:
            return None
        out = list(s)
        out[sp] //= n
        out[cc] *= n
        return tuple(out)
    if k in ("add", "sub", "mul", "div", "lt", "gt"):
        a, b = shapes
        if a == b or b == ():
            return a
        return b if a == () else None
    if k == "snp_unary":
        return () if step.p("fn") in SNP_UNARY_REDUCING else s
    if k == "snp_binary":
        a, b = shapes
        return a if a == b else None
    if k == "concatenate":
        a, b = shapes
        ax = step.p("axis")
        if a != b or ax >= len(a) or math.prod(a) * 2 > MAX_ELEMENTS:
            return None
        return a[:ax] + (a[ax] * 2,) + a[ax + 1:]
    if k == "einsum":
        a, b = shapes
        return (a[0], b[1]) if len(a) == 2 and len(b) == 2 and a[1] == b[0] else None
    if k == "matmul":
        a, b = shapes
        if len(b) != 2 or len(a) not in (1, 2) or a[-1] != b[0]:
            return None
        return a[:-1] + b[1:]
    if k == "where":
        c, x, y = shapes
        return x if x == y and c in (x, ()) else None
    if k == "where_cmp":
        c1, c2, x, y = shapes
        return x if x == y and c1 in (x, ()) and c2 in (x, ()) else None
    if k in ("sum", "mean", "max"):
        ax = step.p("axis")
        if ax is None:
            return ()
        return s[:ax] + s[ax + 1:] if ax < len(s) else None
    if k == "reshape":
        shape = step.p("shape")
        return shape if math.prod(shape) == math.prod(s) else None
    if k == "transpose":
        return tuple(reversed(s))
    if k == "dyn_getitem":
        return s[1:] if s and shapes[1] == () else None
    if k == "index_by_axis":
        return s[1:] if s and s[0] >= _n(step.p("axes"), sizes) else None
    if k == "getitem":
        if not s:
            return None
        idx = step.p("idx")
        return s[1:] if idx == "0" else (min(int(idx[1:]), s[0]),) + s[1:]
    if k in ("cumsum", "flip"):
        return s if s and step.p("axis") < len(s) else None
    if k in ("roll_by_axis", "at_set_by_axis", "at_add_value"):
        if not s or (k == "at_add_value" and shapes[1] != ()):
            return None
        return s
    if k in ("pad_const", "pad_mode", "pad_by_value"):
        if not s or (k == "pad_by_value" and shapes[1] != ()):
            return None
        out = tuple(d + 2 for d in s)
        return out if math.prod(out) <= MAX_ELEMENTS else None
    if k == "sum_dtype":
        return ()
    if k == "sum_initial":
        return s[1:] if s else None
    return s  # lit, neg, exp, tanh, jnp_raw, pow2, astype_to


def result_dtype(step: Step, dtypes: Sequence[str]) -> str:
    if step.kind in ("lt", "gt") or (step.kind == "lit" and step.p("op") in ("<", ">")):
        return "b"
    if step.kind in ("snp_unary", "snp_binary"):
        return SNP_DTYPE.get(step.p("fn"), "f")
    if step.kind == "axis_index" or step.kind == "sum_dtype":
        return "i"
    if step.kind == "astype_to":
        return {"int32": "i", "bool_": "b"}.get(step.p("dt"), "f")
    if step.kind in ("exp", "tanh", "jnp_raw", "mean", "div"):
        return "f"
    if step.kind in ("where", "where_cmp"):
        return dtypes[-1]
    if len(dtypes) == 2 and "f" in dtypes:
        return "f"
    if step.kind == "lit" and isinstance(step.p("literal"), float):
        return "f"
    return dtypes[0] if dtypes else "f"


# ---------------------------------------------------------------------------------------------
# Steering: what spmdtyped's own table predicts (used only to keep programs going)

#: `st.numpy` functions drawn by the snp_unary / snp_binary kinds, and their result dtypes
SNP_UNARY = ("sin", "abs", "square", "sign", "sqrt", "log1p", "expm1", "reciprocal", "floor",
             "isnan", "copy", "zeros_like", "ones_like", "sort", "prod", "argmax", "cumprod",
             "var", "negative")
SNP_UNARY_REDUCING = frozenset({"prod", "argmax", "var"})
SNP_BINARY = ("maximum", "minimum", "arctan2", "power", "equal", "multiply", "subtract",
              "true_divide")
SNP_DTYPE = {"isnan": "b", "argmax": "i", "equal": "b"}
#: the rule-table name of each (steering only)
SNP_RULE = {"negative": "neg", "multiply": "mul", "subtract": "sub", "true_divide": "div",
            "power": "pow", "equal": "eq"}

_RULE_OF = {"all_gather": "all_gather", "all_gather_invarying": "all_gather_invarying",
            "all_gather_reduced": "all_gather_reduced"}


def predict(step: Step, types: Sequence[_rules.SpmdType | None],
            features: _rules.Features = _rules.CONSERVATIVE) -> _rules.SpmdType | None:
    """spmdtyped's predicted result state; raises SpmdTypeError; None when unknown."""
    if any(t is None for t in types):
        return None
    k = step.kind
    if k == "axis_index":
        return _rules.axis_index_type(_axes_tuple(step.p("axes")))
    if k in AXIS_KINDS:
        return _rules.axis_op(_RULE_OF.get(k, k), types[0], _axes_tuple(step.p("axes")), features)  # type: ignore[arg-type]
    if k in ("add", "sub", "mul", "div", "matmul", "lt", "gt"):
        return _rules.combine(k, types, features).type  # type: ignore[arg-type]
    if k == "lit":
        op = {"+": "add", "-": "sub", "*": "mul", "/": "div", "<": "lt", ">": "gt",
              "**": "pow"}[step.p("op")]
        if op == "pow" and isinstance(step.p("literal"), int):
            return _rules.unary("integer_pow", types[0], features)
        ops = [_rules.LITERAL, types[0]] if step.p("literal_first") else [types[0], _rules.LITERAL]
        return _rules.combine(op, ops, features).type
    if k == "where":
        return _rules.combine("where", types, features).type  # type: ignore[arg-type]
    if k in ("snp_binary", "concatenate", "einsum"):
        name = {"concatenate": "concatenate", "einsum": "einsum"}.get(k) or SNP_RULE.get(
            step.p("fn"), step.p("fn"))
        if name not in _rules.ELEMENTWISE:
            return None
        return _rules.combine(name, types, features).type  # type: ignore[arg-type]
    if k == "snp_unary":
        name = SNP_RULE.get(step.p("fn"), step.p("fn"))
        if name not in _rules.ELEMENTWISE:
            return None
        return _rules.unary(name, types[0], features)  # type: ignore[arg-type]
    if k == "where_cmp":
        c = _rules.combine("lt", types[:2], features).type  # type: ignore[arg-type]
        return _rules.combine("where", [c, *types[2:]], features).type  # type: ignore[list-item]
    if k == "jnp_raw" or k in ARGUMENT_KINDS:
        return None  # JAX's own rule / the argument-dependent rules the tests check
    if k in ("dyn_getitem", "index_by_axis"):
        return None  # spmdtyped's dynamic-index rule is what the differential test checks
    name = {"pow2": "integer_pow", "getitem": "getitem", "mean": "sum"}.get(k, k)
    return _rules.unary(name, types[0], features)  # type: ignore[arg-type]


def _axes_tuple(axes: Any) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes)


# ---------------------------------------------------------------------------------------------
# The hypothesis strategy

#: kinds the strategy draws ("snp_call" is built directly by the st.numpy matrix test)
KINDS: tuple[str, ...] = tuple(k for k in TEMPLATES if k != "snp_call" and k not in ARGUMENT_KINDS)
#: drawn more often: the casts that make Unreduced/Reduced values, and where
WEIGHTS = {"pcast_unreduced": 4, "pcast_reduced": 3, "all_gather_reduced": 2, "pvary": 2,
           "pcast_varying": 2, "where_cmp": 2, "lit": 2, "add": 2, "mul": 2,
           "dyn_getitem": 2, "axis_index": 2, "index_by_axis": 2}


@hst.composite
def _axes(draw: Any, names: Sequence[str]) -> Any:
    chosen = draw(hst.lists(hst.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    if len(chosen) == 1 and draw(hst.integers(0, 3)):
        return chosen[0]
    return tuple(chosen)


@hst.composite
def _input(draw: Any, names: Sequence[str], allow_ur: bool) -> Input:
    ndim = draw(hst.sampled_from((2, 2, 1)))
    free = list(names)
    parts: list[tuple[str, ...] | None] = []
    for _ in range(ndim):
        if free and draw(hst.booleans()):
            axes = draw(hst.lists(hst.sampled_from(free), min_size=1, max_size=len(free), unique=True))
            free = [a for a in free if a not in axes]
            parts.append(tuple(axes))
        else:
            parts.append(None)
    red: list[str] = []
    unred: list[str] = []
    if allow_ur and draw(hst.integers(0, 2)) == 0:
        for a in free:
            choice = draw(hst.integers(0, 2))
            if choice == 0:
                red.append(a)
            elif choice == 1:
                unred.append(a)
    shape = (8,) * ndim
    return Input(shape, Spec(tuple(parts), tuple(red), tuple(unred)))


def _pick(draw: Any, candidates: list[int]) -> int | None:
    if not candidates:
        return None
    if draw(hst.booleans()):
        return candidates[-1]
    return draw(hst.sampled_from(candidates))


@hst.composite
def programs(draw: Any, *, min_steps: int = 2, max_steps: int = 14, allow_ur_inputs: bool = True,
             kinds: Sequence[str] = KINDS, features: _rules.Features = _rules.CONSERVATIVE,
             error_rate: int = 8, wrong_out_spec: bool = True) -> Program:
    """Random programs. About 1 in `error_rate` steps that spmdtyped's table rejects is kept
    (ending the program there); the others are redrawn, so most programs run deep."""
    mesh_shape = draw(hst.sampled_from(MESHES))
    names = AXIS_NAMES[: len(mesh_shape)]
    sizes = dict(zip(names, mesh_shape, strict=True))
    inputs = tuple(draw(hst.lists(_input(names, allow_ur_inputs), min_size=1, max_size=3)))
    values: list[ValueInfo] = []
    for inp in inputs:
        values.append(ValueInfo(inp.local_shape, "f", _rules.SpmdType(
            inp.spec.partitioned_axes(), inp.spec.unreduced, inp.spec.reduced)))
    steps: list[Step] = []
    n_steps = draw(hst.integers(min_steps, max_steps))
    attempts = 0
    ended = False
    while len(steps) < n_steps and attempts < 6 * n_steps and not ended:
        attempts += 1
        step = _draw_step(draw, kinds, values, names, sizes)
        if step is None:
            continue
        shapes = [values[a].shape for a in step.args]
        shape = result_shape(step, shapes, sizes)
        if shape is None:
            continue
        try:
            t = predict(step, [values[a].type for a in step.args], features)
        except SpmdTypeError:
            if draw(hst.integers(0, error_rate - 1)):
                continue
            ended = True  # keep it: the program ends with spmdtyped's rejection
            t = None
        except Exception:  # the steering model has no opinion
            t = None
        steps.append(step)
        values.append(ValueInfo(shape, result_dtype(step, [values[a].dtype for a in step.args]), t))
    out = len(values) - 1
    out_spec = _draw_out_spec(draw, values[out], names, wrong_out_spec)
    return Program(tuple(mesh_shape), inputs, tuple(steps), out, out_spec)


def _draw_out_spec(draw: Any, info: ValueInfo, names: Sequence[str], wrong: bool) -> Spec:
    t = info.type
    if t is None or (wrong and draw(hst.integers(0, 5)) == 0):
        # anything: often wrong, which tests the out_specs check
        v = draw(hst.lists(hst.sampled_from(names), unique=True)) if info.shape else []
        rest = [a for a in names if a not in v]
        r = draw(hst.lists(hst.sampled_from(rest), unique=True)) if rest else []
        u = [a for a in rest if a not in r and draw(hst.booleans())]
        return Spec(((tuple(v),) if v else ()), tuple(r), tuple(u))
    v = tuple(a for a in names if a in t.varying)
    if v and not info.shape:
        v = ()  # a Varying scalar cannot be partitioned: the spec is wrong on purpose
    return Spec(((v,) if v else ()), tuple(a for a in names if a in t.reduced),
                tuple(a for a in names if a in t.unreduced))


def _draw_step(draw: Any, kinds: Sequence[str], values: list[ValueInfo], names: Sequence[str],
               sizes: dict[str, int]) -> Step | None:
    kind = draw(hst.sampled_from([k for k in kinds for _ in range(WEIGHTS.get(k, 1))]))
    floats = [i for i, v in enumerate(values) if v.dtype == "f"]
    numeric = [i for i, v in enumerate(values) if v.dtype in ("f", "i")]
    bools = [i for i, v in enumerate(values) if v.dtype == "b"]
    if kind == "axis_index":
        return Step(kind, (), (("axes", draw(_axes(names))),))
    if kind == "where":
        c = _pick(draw, bools)
        if c is None:
            return None
        xs = [i for i in floats if values[c].shape in (values[i].shape, ())]
        x = _pick(draw, xs)
        if x is None:
            return None
        ys = [i for i in floats if values[i].shape == values[x].shape]
        return Step(kind, (c, x, draw(hst.sampled_from(ys))))
    if kind == "where_cmp":
        x = _pick(draw, floats)
        if x is None:
            return None
        same = [i for i in floats if values[i].shape == values[x].shape]
        c1 = draw(hst.sampled_from(same))
        c2 = draw(hst.sampled_from(same))
        return Step(kind, (c1, c2, x, draw(hst.sampled_from(same))))
    src = numeric if kind in AXIS_KINDS - {"pmean"} else floats
    a = _pick(draw, src)
    if a is None:
        return None
    shape = values[a].shape
    ndim = len(shape)
    params: list[tuple[str, Any]] = []
    args: tuple[int, ...] = (a,)
    if kind in AXIS_KINDS:
        axes = draw(_axes(names))
        params.append(("axes", axes))
        n = _n(axes, sizes)
        if kind in ("ppermute",):
            shift = draw(hst.integers(1, max(n - 1, 1)))
            params.append(("perm", tuple((s, (s + shift) % n) for s in range(n))))
        elif kind == "pshuffle":
            shift = draw(hst.integers(0, n - 1))
            params.append(("perm", tuple((s + shift) % n for s in range(n))))
        elif kind.startswith("all_gather"):
            tiled = ndim > 0 and draw(hst.booleans())
            params += [("axis", draw(hst.integers(0, ndim - 1 if tiled else ndim))), ("tiled", tiled)]
        elif kind == "psum_scatter":
            if not ndim:
                return None
            d = draw(hst.integers(0, ndim - 1))
            params += [("dim", d), ("tiled", shape[d] != n or draw(hst.booleans()))]
        elif kind == "all_to_all":
            if not ndim:
                return None
            params += [("split", draw(hst.integers(0, ndim - 1))),
                       ("concat", draw(hst.integers(0, ndim - 1)))]
    elif kind in ("add", "sub", "mul", "div", "lt", "gt"):
        pool = numeric if kind in ("add", "sub", "mul") else floats
        cands = [i for i in pool if values[i].shape in (shape, ())]
        b = _pick(draw, cands)
        args = (a, a if b is None else b)
        if draw(hst.booleans()):
            args = args[::-1]
    elif kind == "snp_unary":
        params.append(("fn", draw(hst.sampled_from(SNP_UNARY))))
    elif kind in ("snp_binary", "concatenate"):
        b = _pick(draw, [i for i in floats if values[i].shape == shape])
        args = (a, a if b is None else b)
        if draw(hst.booleans()):
            args = args[::-1]
        if kind == "snp_binary":
            params.append(("fn", draw(hst.sampled_from(SNP_BINARY))))
        else:
            if not ndim:
                return None
            params.append(("axis", draw(hst.integers(0, ndim - 1))))
    elif kind in ("matmul", "einsum"):
        cands = [i for i in floats if len(values[i].shape) == 2 and ndim in (1, 2)
                 and values[i].shape[0] == shape[-1]]
        b = _pick(draw, cands)
        if b is None:
            return None
        args = (a, b)
    elif kind == "lit":
        params += [("op", draw(hst.sampled_from(("+", "-", "*", "/", "+", "*", "<", ">", "**")))),
                   ("literal", draw(hst.sampled_from(LITERALS))),
                   ("literal_first", draw(hst.integers(0, 3)) == 0)]
    elif kind in ("roll_by_axis", "at_set_by_axis"):
        params.append(("sec", draw(_axes(names))))
    elif kind in ("at_add_value", "pad_by_value"):
        b = _pick(draw, [i for i in floats if values[i].shape == ()])
        if b is None:
            return None
        args = (a, b)
    elif kind == "pad_const":
        params.append(("lit", draw(hst.sampled_from((0.0, 2.0)))))
    elif kind == "pad_mode":
        params.append(("mode", draw(hst.sampled_from(("edge", "maximum", "wrap", "mean")))))
    elif kind == "astype_to":
        params.append(("dt", draw(hst.sampled_from(("float16", "int32", "bool_")))))
    elif kind == "jnp_raw":
        params.append(("fn", draw(hst.sampled_from(("exp", "tanh", "sin")))))
    elif kind in ("sum", "mean", "max"):
        params.append(("axis", draw(hst.sampled_from([None, *range(ndim)]))))
    elif kind == "reshape":
        size = math.prod(shape)
        opts = [(size,)]
        if size % 8 == 0 and size > 8:
            opts.append((8, size // 8))
        params.append(("shape", draw(hst.sampled_from(opts))))
    elif kind == "index_by_axis":
        params.append(("axes", draw(_axes(names))))
    elif kind == "dyn_getitem":
        b = _pick(draw, [i for i, v in enumerate(values) if v.dtype == "i" and v.shape == ()])
        if b is None or not ndim:
            return None
        args = (a, b)
    elif kind == "getitem":
        params.append(("idx", draw(hst.sampled_from(("0", ":4" if shape and shape[0] >= 8 else ":1")))))
    elif kind in ("cumsum", "flip"):
        if not ndim:
            return None
        params.append(("axis", draw(hst.integers(0, ndim - 1))))
    return Step(kind, args, tuple(params))

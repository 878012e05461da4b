"""THE surface table: every Python form of typed code -> its rule and its JAX binding.

One row per form: operators (`x % y`, `-x`), array methods and properties (`x.sum()`,
`x.T`), indexing, `.at[i].<method>(v)`, the `st.numpy` and `st.nn` functions, constructors,
collectives and casts (their own table, `collectives.py`: one `Collective` row each with its
signature, binding and jaxpr primitives). The runtime builds itself from these rows (`_hints` dunders, `_array`
methods and `.at[]`, `numpy`, `nn`, `lax`, the lazy names of `spmdtyped`); the static view,
the mypy plugin, the codemod and the docs read them; `tests/test_surface.py` checks every row
against the runtime. Imports no JAX, only `_rules`.

`ROWS` is every row as one flat tuple (`form`, `kind`, `rule`, `arity`, ...) for parity tests.
"""

from __future__ import annotations

import dataclasses

from .._rules.arguments import DTYPE_KINDS
from .._rules.elementwise import ELEMENTWISE
from .._rules.functions import AT_METHODS, CONSTRUCTORS, LIKE_CONSTRUCTORS
from .._rules.primitives import IDENTITIES, PRIMITIVES
from .collectives import AXIS_PRIMITIVES as AXIS_PRIMITIVES
from .collectives import COLLECTIVE_NAMES as COLLECTIVE_NAMES
from .collectives import COLLECTIVES as COLLECTIVES
from .collectives import LAX_NAMES as LAX_NAMES
from .collectives import REQUIRED as REQUIRED
from .collectives import TYPED_COLLECTIVES as TYPED_COLLECTIVES
from .collectives import Collective as Collective
from .collectives import Param as Param
from .collectives import all_collectives as all_collectives
from .collectives import axis_primitive as axis_primitive
from .collectives import collective as collective
from .collectives import registered as registered

#: how a function or method applies its rule to its arguments:
#: "unary"  -- the first argument only (further arguments are shapes, axes, shifts): `unary`
#: "binary" -- the two arguments, as the operators bind them: `binary`
#: "where"  -- `functions.where_type`: `combine` of (cond, x, y) after 0.12's x/y auto-cast
#: "join"   -- the arrays of a sequence (`concatenate`, `stack`): `combine`
#: "einsum" -- the operands after the subscripts string: `combine`
#: "take"   -- `functions.take_type`: unary with a constant index, n-ary with a traced one
#: "like"   -- `constructor_type(name, like=first argument)` (full_like: `functions.fill_type`)
#: "new"    -- `constructor_type(name)` (full: `functions.fill_type`)
#: "mean"   -- `functions.mean_type`: bound as `functions.mean_bind` says (jnp.mean, or the
#:             sum then a Python-scalar division)
#: "index"  -- `x[i]`: `unary("getitem")` static, `functions.dynamic_index_type` traced
#: "at"     -- `functions.at_update_type`
#: "axis"   -- a collective or cast: `axis_op` with the row's `AXIS_OPS` entry
#: "slice"  -- `functions.dynamic_index_type` of the array with its start index (a literal start:
#:             the unary `dynamic_slice`), as `x[i]` with a traced `i` (`dynamic_slice_in_dim`)
#: "split"  -- the first argument's unary rule, the same state for every piece of the list
#: "attr"   -- a plain attribute of the JAX value (shape, dtype, ...): no state
FUNCTION_BINDINGS: tuple[str, ...] = ("unary", "binary", "nary", "join", "einsum", "take", "like",
                                      "new", "slice", "split")

#: how a row's refinement (Shard/Partial/Rep, DESIGN.md §1b) is computed; the runtime
#: dispatches on it (`_refining.REFINERS`), each kind calls one rule of `_rules.refine*`:
#: "elementwise" -- `refine.elementwise` (right-aligned broadcasting of the operands)
#: "where"       -- `refine.elementwise("where", ..., onehot_fill=)`: the owner mask
#: "reduction"   -- `refine.reduction` with axis/keepdims (sum over a Shard dim: Partial)
#: "along"       -- `refine.along_dim` (cumsum/sort/flip/roll along one dim)
#: "take"        -- `refine_shape.take` (the gathered dim, the index's variation)
#: "einsum"      -- `refine.einsum` with the subscripts
#: "matmul"      -- `refine.einsum` with `matmul_spec` / `dot_spec` of the ranks
#: "reshape" / "transpose" / "squeeze" / "expand" / "broadcast" -- `refine_shape.<kind>`
#: "index"       -- `refine_shape.index` (static items; traced: "array")
#: "at"          -- `refine_shape.at_update`
#: "concat" / "stack" -- `refine_shape.concatenate`
#: "softmax"     -- `refine.softmax` (a max, exp, sum and divide over a dim: SPMD211 on a Shard)
#: "one_hot"     -- `refine_shape.one_hot` (non-linear, appends a dim)
#: "collective"  -- `refine_shape.collective` with the call's parameters
#: "constructor" -- a new constant (no data, plain)
#: "plain"       -- no refinement (attributes)
REFINE_KINDS: tuple[str, ...] = (
    "elementwise", "where", "reduction", "along", "take", "einsum", "matmul", "reshape",
    "transpose", "squeeze", "expand", "broadcast", "index", "at", "concat", "stack", "softmax",
    "one_hot", "collective", "constructor", "plain")


@dataclasses.dataclass(frozen=True)
class Row:
    """One Python form.

    - `form`: the source spelling (`x % y`, `x.sum()`, `st.numpy.exp(x)`, `st.psum(x, axes)`).
    - `kind`: "operator", "unary_operator", "method", "property", "index", "at", "numpy",
      "nn", "collective".
    - `name`: the Python name that implements it (dunder, method/attribute, function name).
    - `rule`: the `ELEMENTWISE` key, constructor name or `AXIS_OPS` key (None: no state).
    - `arity`: typed operands the rule sees (1 or 2; 0 for attributes and axis_index).
    - `binding`: how it applies the rule (see `FUNCTION_BINDINGS` and the comment above it).
    - `jax`: the JAX callable it binds, dotted (`operator.mod`, `jax.numpy.exp`, `jax.lax.psum`).
    - `reflected`: the reflected dunder (`__rmod__`) for binary operators.
    - `symbol`: the operator symbol (`%`) for operators.
    - `refine`: how the Shard/Partial/Rep refinement of the result is computed (one of
      `REFINE_KINDS`; the rule functions of `_rules.refine` / `_rules.refine_shape`).
    - `dtypes`: how the rule depends on the operands' dtypes (one of
      `_rules.DTYPE_KINDS`, applied by `_rules.dtype_rule`; None: it does not). The static
      views, which do not see dtypes, apply `rule`.
    """

    form: str
    kind: str
    name: str
    rule: str | None
    arity: int
    binding: str
    jax: str
    reflected: str | None = None
    symbol: str | None = None
    refine: str = "plain"
    dtypes: str | None = None


# ------------------------------------------------------------------------------ operators

_BINARY_OPERATORS: tuple[tuple[str, str, str, bool], ...] = (
    # (dunder stem, symbol, rule, reflected)
    ("add", "+", "add", True), ("sub", "-", "sub", True), ("mul", "*", "mul", True),
    ("truediv", "/", "div", True), ("matmul", "@", "matmul", True), ("pow", "**", "pow", True),
    ("mod", "%", "mod", True), ("floordiv", "//", "floordiv", True),
    ("and", "&", "and", True), ("or", "|", "or", True), ("xor", "^", "xor", True),
    # comparisons: Python reflects them by swapping (`2 < x` is `x.__gt__(2)`)
    ("lt", "<", "lt", False), ("le", "<=", "le", False), ("gt", ">", "gt", False),
    ("ge", ">=", "ge", False), ("eq", "==", "eq", False), ("ne", "!=", "ne", False),
)
#: Python's `operator` function for each dunder stem (`and` -> `operator.and_`)
_OPERATOR_FN = {"and": "and_", "or": "or_"}

OPERATORS: tuple[Row, ...] = tuple(
    Row(f"x {sym} y", "operator", f"__{stem}__", rule, 2, "binary",
        f"operator.{_OPERATOR_FN.get(stem, stem)}", f"__r{stem}__" if refl else None, sym,
        "matmul" if rule == "matmul" else "elementwise")
    for stem, sym, rule, refl in _BINARY_OPERATORS
)

UNARY_OPERATORS: tuple[Row, ...] = (
    Row("-x", "unary_operator", "__neg__", "neg", 1, "unary", "operator.neg", symbol="-",
        refine="elementwise"),
    Row("+x", "unary_operator", "__pos__", "copy", 1, "unary", "operator.pos", symbol="+",
        refine="elementwise"),
    Row("~x", "unary_operator", "__invert__", "logical_not", 1, "unary", "operator.invert",
        symbol="~", refine="elementwise"),
    Row("abs(x)", "unary_operator", "__abs__", "abs", 1, "unary", "builtins.abs",
        refine="elementwise"),
)

# ------------------------------------------------------------------------------ methods

METHODS: tuple[Row, ...] = (
    *(Row(f"x.{n}()", "method", n, n, 1, "unary", f"jax.numpy.{n}", refine="reduction")
      for n in ("sum", "max", "min")),
    Row("x.mean()", "method", "mean", "mean", 1, "mean", "jax.numpy.mean", refine="reduction"),
    *(Row(f"x.{n}(...)", "method", n, n, 1, "unary", f"jax.Array.{n}", refine=k)
      for n, k in (("reshape", "reshape"), ("transpose", "transpose"), ("astype", "elementwise"),
                   ("squeeze", "squeeze"), ("ravel", "reshape"))),
)

PROPERTIES: tuple[Row, ...] = (
    Row("x.T", "property", "T", "transpose", 1, "unary", "jax.Array.T", refine="transpose"),
    Row("x.mT", "property", "mT", "transpose", 1, "unary", "jax.Array.mT", refine="transpose"),
    *(Row(f"x.{n}", "property", n, None, 0, "attr", f"jax.Array.{n}")
      for n in ("shape", "dtype", "ndim", "size", "weak_type")),
)

#: `x[i]` with static indices (ints, slices, None, Ellipsis)
STATIC_INDEX = Row("x[i]", "index", "__getitem__", "getitem", 1, "index", "operator.getitem",
                   refine="index")
#: `x[i]` with a traced (array-valued) index: `functions.dynamic_index_type`
TRACED_INDEX = Row("x[traced_i]", "index", "__getitem__", "dynamic_slice", 2, "index",
                   "operator.getitem", refine="index")
INDEXING: tuple[Row, ...] = (STATIC_INDEX, TRACED_INDEX)

AT: tuple[Row, ...] = tuple(
    Row(f"x.at[i].{m}(v)", "at", m, rule, 2, "at", f"jax.Array.at[].{m}", refine="at")
    for m, rule in AT_METHODS.items()
)

# ------------------------------------------------------------------------------ st.numpy, st.nn

_NUMPY: tuple[tuple[str, str, str], ...] = (
    # (st.numpy name, rule, binding); the refinement kind is `_NUMPY_REFINE` (default by binding)
    *((n, n, "unary") for n in ("exp", "log", "tanh", "sqrt", "rsqrt", "sin", "cos", "abs",
                                "square", "sign", "log1p", "expm1", "reciprocal", "floor",
                                "ceil", "round", "isnan", "isfinite", "conj", "copy")),
    ("absolute", "abs", "unary"), ("negative", "neg", "unary"),
    *((n, r, "binary") for n, r in (
        ("add", "add"), ("subtract", "sub"), ("multiply", "mul"), ("divide", "div"),
        ("true_divide", "div"), ("power", "pow"), ("maximum", "maximum"), ("minimum", "minimum"),
        ("less", "lt"), ("less_equal", "le"), ("greater", "gt"), ("greater_equal", "ge"),
        ("equal", "eq"), ("not_equal", "ne"), ("arctan2", "arctan2"), ("mod", "mod"),
        ("remainder", "mod"), ("floor_divide", "floordiv"))),
    # dtype-dependent (`_NUMPY_DTYPES`): a non-boolean operand is compared with zero first
    ("logical_not", "logical_not", "unary"), ("logical_and", "and", "binary"),
    ("logical_or", "or", "binary"), ("logical_xor", "xor", "binary"),
    # dtype-dependent: the rule here is the complex one; of a real array `_rules.REAL_PARTS`
    ("imag", "imag", "unary"), ("real", "real", "unary"),
    ("where", "where", "where"),
    *((n, r, "unary") for n, r in (("sum", "sum"), ("max", "max"), ("min", "min"),
                                   ("amax", "max"), ("amin", "min"), ("prod", "prod"),
                                   ("var", "var"), ("std", "std"))),
    ("mean", "mean", "mean"),
    *((n, n, "unary") for n in ("cumsum", "cumprod", "argmax", "argmin", "flip", "sort")),
    *((n, n, "unary") for n in ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims",
                                "squeeze", "ravel", "broadcast_to", "roll", "tile", "repeat",
                                "pad", "tril", "triu")),
    ("split", "split", "split"),
    ("concatenate", "concatenate", "join"), ("stack", "stack", "join"),
    ("einsum", "einsum", "einsum"), ("dot", "dot", "binary"), ("matmul", "matmul", "binary"),
    ("take", "take", "take"), ("take_along_axis", "take", "take"),
    ("dynamic_slice_in_dim", "dynamic_slice_in_dim", "slice"),
    *((n, n, "like") for n in LIKE_CONSTRUCTORS),
    *((n, n, "new") for n in CONSTRUCTORS),
)
#: the refinement kind of each st.numpy row whose kind is not its binding's default
_NUMPY_REFINE: dict[str, str] = {
    **dict.fromkeys(("sum", "max", "min", "amax", "amin", "prod", "var", "std", "mean", "argmax",
                     "argmin"), "reduction"),
    **dict.fromkeys(("cumsum", "cumprod", "flip", "sort", "roll", "tril", "triu", "split",
                     "dynamic_slice_in_dim"), "along"),
    **dict.fromkeys(("reshape", "ravel"), "reshape"),
    **dict.fromkeys(("transpose", "swapaxes", "moveaxis"), "transpose"),
    "expand_dims": "expand", "squeeze": "squeeze",
    **dict.fromkeys(("broadcast_to", "tile", "repeat", "pad"), "broadcast"),
    "concatenate": "concat", "stack": "stack", "dot": "matmul", "matmul": "matmul",
}
#: the st.numpy rows whose rule depends on the operands' dtypes (`Row.dtypes`)
_NUMPY_DTYPES: dict[str, str] = {
    **dict.fromkeys(("logical_not", "logical_and", "logical_or", "logical_xor"), "logical"),
    "real": "part", "imag": "part",
}
_BINDING_REFINE = {"unary": "elementwise", "binary": "elementwise", "where": "where",
                   "mean": "reduction", "join": "concat", "einsum": "einsum", "take": "take",
                   "like": "constructor", "new": "constructor", "slice": "along", "split": "along"}
_ARITY = {"unary": 1, "mean": 1, "like": 1, "new": 0, "binary": 2, "take": 2, "where": 3,
          "join": 2, "einsum": 2, "slice": 2, "split": 1}
#: the st.numpy rows whose JAX function is not `jax.numpy.<name>` (jax.numpy has no rsqrt)
_NUMPY_JAX: dict[str, str] = {"rsqrt": "jax.lax.rsqrt",
                              "dynamic_slice_in_dim": "jax.lax.dynamic_slice_in_dim"}

NUMPY: tuple[Row, ...] = tuple(
    Row(f"st.numpy.{n}(...)", "numpy", n, r, _ARITY[b], b, _NUMPY_JAX.get(n, f"jax.numpy.{n}"),
        refine=_NUMPY_REFINE.get(n, _BINDING_REFINE[b]), dtypes=_NUMPY_DTYPES.get(n))
    for n, r, b in _NUMPY
)
NN: tuple[Row, ...] = tuple(
    Row(f"st.nn.{n}(x)", "nn", n, n, 1, "unary", f"jax.nn.{n}", refine=k)
    for n, k in (("relu", "elementwise"), ("gelu", "elementwise"), ("silu", "elementwise"),
                 ("sigmoid", "elementwise"), ("softplus", "elementwise"), ("softmax", "softmax"),
                 ("log_softmax", "softmax"), ("logsumexp", "softmax"), ("one_hot", "one_hot"))
)

# ------------------------------------------------------------------------------ JAX's spellings
# The forms users write with JAX itself (`jnp.exp(x)`, `jax.nn.relu(x)`, `jax.lax.psum(x, "tp")`)
# are the rows above under JAX's name: the mypy plugin types them from the same row when an
# argument is a typed value (plain arguments keep JAX's own `jax.Array`).

#: jax.lax functions that apply an st.numpy row (lax name -> row name): the elementwise ones
#: whose rule and refinement are the row's (`jax.lax.max` is `maximum`, not the reduction)
_LAX_ROWS: dict[str, str] = {
    **{n: n for n in ("exp", "log", "tanh", "sqrt", "sin", "cos", "abs", "square", "sign",
                      "log1p", "expm1", "floor", "ceil", "reciprocal")},
    "neg": "negative", "add": "add", "sub": "subtract", "mul": "multiply", "div": "divide",
    "max": "maximum", "min": "minimum", "pow": "power", "atan2": "arctan2",
}
#: JAX's full name of a form -> its row: every st.numpy / st.nn row's `jax` function
#: (`jax.numpy.exp`, `jax.lax.rsqrt`, `jax.nn.relu`) and the jax.lax names of `_LAX_ROWS`
JAX_FUNCTIONS: dict[str, Row] = {
    **{r.jax: r for r in (*NUMPY, *NN)},
    **{f"jax.lax.{lax}": r for lax, name in _LAX_ROWS.items()
       for r in NUMPY if r.name == name},
}
#: JAX's module prefixes of the public ones (where a function is defined, as a checker names it)
_JAX_MODULES: tuple[tuple[str, str], ...] = (
    ("jax._src.numpy.", "jax.numpy."), ("jax._src.nn.", "jax.nn."), ("jax._src.lax.", "jax.lax."))


def jax_public(fullname: str) -> str:
    """The public spelling of a JAX function's full name: `jax._src.lax.parallel.psum` ->
    `jax.lax.psum`, `jax._src.numpy.ufuncs.exp` -> `jax.numpy.exp` (JAX's stubs declare some
    names where they are defined); other names unchanged."""
    for private, public in _JAX_MODULES:
        if fullname.startswith(private):
            return public + fullname.rpartition(".")[2]
    return fullname


def by_jax_name(fullname: str) -> Row | None:
    """The row JAX's function `fullname` (public or private spelling) applies, or None."""
    return JAX_FUNCTIONS.get(jax_public(fullname))


# ------------------------------------------------------------------------------ collectives


# The collectives and casts: `collectives.py` (`COLLECTIVES`, re-exported here); as `Row`s
# for the parity tests:
COLLECTIVE_ROWS: tuple[Row, ...] = tuple(
    Row(f"st.{c.name}(x, axes)", "collective", c.name, op, 1, "axis", c.jax, refine=c.refine)
    for c in COLLECTIVES for op in c.ops
)

# ------------------------------------------------------------------------------ all rows

ROWS: tuple[Row, ...] = (*OPERATORS, *UNARY_OPERATORS, *METHODS, *PROPERTIES, *INDEXING, *AT,
                         *NUMPY, *NN, *COLLECTIVE_ROWS)

_BY_DUNDER = {r.name: r for r in (*OPERATORS, *UNARY_OPERATORS)}
_BY_DUNDER.update({r.reflected: r for r in OPERATORS if r.reflected})
_BY_ATTR = {r.name: r for r in (*METHODS, *PROPERTIES)}
_BY_FUNCTION = {**{f"numpy.{r.name}": r for r in NUMPY}, **{f"nn.{r.name}": r for r in NN}}


def by_dunder(name: str) -> Row | None:
    """The operator row of `__mod__` / `__rmod__` / `__neg__` ..., or None."""
    return _BY_DUNDER.get(name)


def by_attribute(name: str) -> Row | None:
    """The method/property row of `x.<name>`, or None (`at` is `AT`, not an attribute row)."""
    return _BY_ATTR.get(name)


def by_function(module: str, name: str) -> Row | None:
    """The row of `st.<module>.<name>` (`module`: "numpy" or "nn"), or None."""
    return _BY_FUNCTION.get(f"{module}.{name}")


# ------------------------------------------------------------------------------ refinement kinds
# The one table of refinement kinds: each row's `refine`. The runtime reads a form's row
# (`_typed.refining.REFINERS`); the mypy plugin and the jaxpr walk, which see a rule name or a
# primitive rather than a form, read the two views below.

#: rule name -> the refinement kind of the rows that apply it (one kind per rule: `_check`)
REFINE_OF_RULE: dict[str, str] = {r.rule: r.refine for r in ROWS if r.rule is not None}


def refine_kind(rule: str) -> str:
    """The refinement kind of the rows that apply `rule`; "elementwise" for a rule no row
    applies (the static checker's fallback for a one-operand form)."""
    return REFINE_OF_RULE.get(rule, "elementwise")


#: the jaxpr primitives the walk refines by kind that no row's rule stands for: their
#: (kind, rule name). `reduce_and`/`reduce_or`/`cummax`/`cummin` have no row; the elementwise
#: primitives are refined by `_rules.refine.elementwise` under the primitive's own name.
_PRIMITIVE_KINDS: dict[str, tuple[str, str]] = {
    "reduce_and": ("reduction", "all"), "reduce_or": ("reduction", "any"),
    "cummax": ("along", "cummax"), "cummin": ("along", "cummin"),
    **{p: ("elementwise", p) for p in (
        "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "pow", "atan2", "rem",
        "clamp", "lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "not", "exp", "exp2",
        "log", "tanh", "sin", "cos", "tan", "sqrt", "rsqrt", "abs", "square", "sign", "log1p",
        "expm1", "logistic", "erf", "erfc", "erf_inv", "floor", "ceil", "round", "is_finite",
        "integer_pow", "convert_element_type", "reduce_precision", *IDENTITIES, "conj",
        "real", "imag", "stop_gradient", "cbrt", "asin", "acos", "atan", "sinh", "cosh",
        "asinh", "acosh", "atanh", "lgamma", "digamma", "nextafter", "shift_left",
        "shift_right_logical", "shift_right_arithmetic", "population_count", "select_n")},
}
#: jaxpr primitive -> (refinement kind, rule name), for the jaxpr walk (`_engine.refine_walk`):
#: a primitive whose rule (`_rules.PRIMITIVES`) rows apply as a reduction or along one dim has
#: their kind (`reduce_sum` -> ("reduction", "sum"), `rev` -> ("along", "flip")); the others
#: are `_PRIMITIVE_KINDS`
PRIMITIVE_REFINE: dict[str, tuple[str, str]] = {
    **{p: (REFINE_OF_RULE[r], r) for p, r in PRIMITIVES.items()
       if REFINE_OF_RULE.get(r) in ("reduction", "along")},
    **_PRIMITIVE_KINDS,
}


def _check() -> None:
    rules = {r.rule for r in ROWS if r.rule is not None and r.kind not in ("collective",)}
    known = set(ELEMENTWISE) | set(CONSTRUCTORS) | set(LIKE_CONSTRUCTORS)
    missing = sorted(rules - known)
    assert not missing, f"surface rows name unknown rules: {missing}"
    bad = sorted({r.refine for r in ROWS} - set(REFINE_KINDS))
    assert not bad, f"surface rows name unknown refinement kinds: {bad}"
    two = sorted({r.rule for r in ROWS if r.rule is not None and r.refine != REFINE_OF_RULE[r.rule]})
    assert not two, f"rows of one rule name two refinement kinds: {two}"
    both = sorted(set(_PRIMITIVE_KINDS) & {p for p, r in PRIMITIVES.items() if r in REFINE_OF_RULE
                                          and REFINE_OF_RULE[r] in ("reduction", "along")})
    assert not both, f"primitives whose kind is both a row's and listed: {both}"
    bad = sorted({r.dtypes for r in ROWS if r.dtypes is not None} - set(DTYPE_KINDS))
    assert not bad, f"surface rows name unknown dtype kinds: {bad}"


_check()

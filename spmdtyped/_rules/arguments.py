"""Rules that depend on an op's other arguments: keywords, dtypes and secondary arrays.

- `argument_rule`: the `ELEMENTWISE` row an op applies given its keywords and dtypes.
  `pad` is linear only with a zero constant or a mode that moves values (edge, reflect,
  symmetric, wrap, empty); `astype` to an integer (from floating/complex) or to bool and
  `sum(dtype=int|bool)` round, so are not linear; a reduction's `initial=c` adds a constant
  and its `where=mask` selects against an Invariant filler.
- `SECONDARY` / `POSITIONAL`: the other array arguments whose state flows into the result
  (`roll`'s shift, `pad`'s constant_values, `softmax`'s where, `logsumexp`'s b, a reduction's
  where/initial), and where they sit positionally.
- `secondary_join`: the result state once those arguments are joined in (JAX's auto-cast of
  the operand to their varying axes; Unreduced and Reduced secondary arguments are rejected).
- `dtype_rule`: the rule of a row whose rule depends on its operands' dtypes
  (`_surface.Row.dtypes`: `jnp.logical_*`, `jnp.real` / `jnp.imag`).

Values are Python literals as written (the runtime passes the values; the mypy plugin passes
what it can read from source, `UNKNOWN` otherwise); dtypes are NumPy names (`"float32"`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .._errors import error
from .combine import combine, unary
from .elementwise import Operand
from .features import CONSERVATIVE, Features
from .functions import auto_cast
from .states import INVARIANT, SpmdType, fmt_axes


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


#: a keyword or dtype the caller cannot read (the plugin, for a non-literal argument)
UNKNOWN = _Unknown()

#: the dtype the static view (the mypy plugin) assumes for an array, whose dtype it cannot
#: see: JAX's default floating dtype. Partial sums are floating, and it is the strict choice:
#: `astype(int)` / `sum(dtype=int)` of a float rounds each partial value (not linear), of an
#: int it would be linear. The runtime reads the real dtype.
STATIC_DTYPE = "float32"

#: rule -> the names of its arguments after the array, in JAX's positional order
POSITIONAL: dict[str, tuple[str, ...]] = {
    "roll": ("shift", "axis"),
    "pad": ("pad_width", "mode"),
    "astype": ("dtype",),
    **dict.fromkeys(("sum", "prod", "max", "min"),
                    ("axis", "dtype", "out", "keepdims", "initial", "where")),
    "softmax": ("axis", "where"), "log_softmax": ("axis", "where"),
    "logsumexp": ("axis", "b", "keepdims", "return_sign", "where"),
}

#: rule -> the arguments (names of `POSITIONAL` or keywords) whose state joins the result
SECONDARY: dict[str, tuple[str, ...]] = {
    "roll": ("shift",),
    "pad": ("constant_values", "end_values"),
    **dict.fromkeys(("sum", "prod", "max", "min", "mean", "var", "std"), ("where", "initial")),
    "softmax": ("where",), "log_softmax": ("where",),
    "logsumexp": ("b", "where"),
}

#: pad modes that only move or copy values (linear in the array); `constant` is linear with a
#: zero constant only; reflect / symmetric reverse slices (JAX's `rev`: `pad_reverse`)
_PAD_LINEAR_MODES = frozenset({"edge", "wrap", "empty"})
_PAD_REVERSE_MODES = frozenset({"reflect", "symmetric"})
_PAD_EXTREMUM_MODES = frozenset({"maximum", "minimum"})


def _kind(dtype: object) -> str | None:
    """"b" bool, "i" integer, "f" floating, "c" complex; None when not a known dtype name."""
    if not isinstance(dtype, str):
        return None
    d = dtype.lower()
    if d in ("bool", "bool_"):
        return "b"
    if d.startswith(("int", "uint")):
        return "i"
    if d.startswith(("float", "bfloat")):
        return "f"
    if d.startswith("complex"):
        return "c"
    return None


def _is_zero(value: object) -> bool | None:
    """Whether a literal (a number or nested tuples/lists of them) is all zeros."""
    if value is UNKNOWN:
        return None
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float, complex)):
        return value == 0
    if isinstance(value, (tuple, list)):
        parts = [_is_zero(v) for v in value]
        return None if None in parts else all(parts)
    return None


def argument_rule(rule: str, keywords: Mapping[str, object], dtype: object = UNKNOWN) -> str | None:
    """The `ELEMENTWISE` row of `rule` for these keyword arguments (positional ones named by
    `POSITIONAL`) and input dtype; None when an argument the choice needs is `UNKNOWN`."""
    if rule == "pad":
        mode = keywords.get("mode", "constant")
        if mode is UNKNOWN:
            return None
        if mode == "constant":
            cv = keywords.get("constant_values", 0)
            if cv is None:
                return "pad_zero"
            if cv is UNKNOWN:
                return None
            return "pad_zero" if _is_zero(cv) else "pad_affine"  # an array: not known to be zero
        if mode in _PAD_LINEAR_MODES:
            return "pad"
        if mode in _PAD_REVERSE_MODES:
            return "pad_reverse"
        if mode in _PAD_EXTREMUM_MODES:
            return "pad_extremum"
        return "pad_mixing"  # mean, median, linear_ramp, a callable: an Invariant constant mixes in
    if rule == "astype":
        to = _kind(keywords.get("dtype", UNKNOWN))
        src = _kind(dtype)
        if to is None:
            return None
        if to == "b":
            return "astype_nonlinear"
        if to == "i":
            if src is None:
                return None
            return "astype_nonlinear" if src in ("f", "c") else "astype"
        return "astype"
    if rule in ("sum", "prod", "max", "min"):
        initial, where = keywords.get("initial"), keywords.get("where")
        if initial is UNKNOWN or where is UNKNOWN:
            return None
        if initial is not None:
            return "reduce_initial"
        if where is not None:
            return "reduce_where"
        out_dtype = keywords.get("dtype")
        if rule != "sum":
            return rule
        if out_dtype is None:
            return "sum"
        to_k, src = _kind(out_dtype), _kind(dtype)
        if to_k == "b":
            return "sum_nonlinear"  # whatever the input's dtype
        if to_k is None or src is None:
            return None
        return "sum_nonlinear" if to_k == "b" or (to_k == "i" and src in ("f", "c")) else "sum"
    return rule


def named_arguments(rule: str, args: Sequence[object], keywords: Mapping[str, object]
                    ) -> dict[str, object]:
    """The keyword view of a call's arguments after the array (`POSITIONAL` names them)."""
    out = dict(zip(POSITIONAL.get(rule, ()), args, strict=False))
    out.update(keywords)
    return out


def secondary_join(t: SpmdType, secondary: Sequence[tuple[str, SpmdType]],
                   features: Features = CONSERVATIVE, *, op: str) -> SpmdType:
    """The result state `t` of an op once its secondary array arguments are joined in.

    A secondary argument that varies makes the result vary (JAX auto-casts the operand:
    Reduced -> Varying on exactly its Reduced axes; an Unreduced operand cannot: SPMD201).
    An Unreduced secondary argument is rejected (the op is not linear in it: SPMD202); a
    Reduced one next to an operand that is not Reduced there is rejected as JAX does
    (SPMD203: JAX refuses to mix replicated and reduced inputs)."""
    del features  # the join is the same on every supported JAX
    for name, s in secondary:
        if s.unreduced:
            axes = sorted(s.unreduced)
            raise error("SPMD202", f"{op}: argument {name!r} is Unreduced on {axes}; the op is not "
                        f"linear in it", axes=axes, states=s.states(axes), op=op,
                        fix=f"reduce it first: st.psum({name}, {fmt_axes(axes)})")
        t = auto_cast(t, s.varying, op=op, what="the array")
        bad = sorted(s.reduced - t.reduced - t.varying)
        if bad:
            raise error("SPMD203", f"{op}: argument {name!r} is Reduced on {bad} where the array "
                        f"is Invariant (JAX: inputs cannot be replicated on the axes another input "
                        f"is reduced on)", axes=bad, states=s.states(bad), op=op,
                        fix=f"st.pcast({name}, {fmt_axes(bad)}, to='varying'), or pass a Python "
                            f"scalar")
        t = t.replace(varying=t.varying | (s.reduced & t.varying))
    return t


def call_type(rule: str, t: SpmdType, keywords: Mapping[str, object], dtype: object,
              secondary: Sequence[tuple[str, SpmdType]], features: Features = CONSERVATIVE, *,
              op: str) -> SpmdType | None:
    """The result state of a one-array call (`rule` on `t`, with its other arguments): the
    argument-dependent row, then the secondary join. None when the row cannot be chosen."""
    row = argument_rule(rule, keywords, dtype)
    if row is None:
        return None
    return secondary_join(unary(row, t, features, op=op), secondary, features, op=op)


#: how a row's rule depends on its array operands' dtypes (`_surface.Row.dtypes`), as
#: `jax.numpy` implements it:
#: "logical" -- `jnp.logical_*` compare a non-boolean operand with zero first (`x != 0`: the
#:              `ne` rule against an Invariant zero), then apply the row's rule;
#: "part"    -- `jnp.real` / `jnp.imag` bind their primitive (the row's rule) on a complex
#:              array only; of a real one they apply `REAL_PARTS` instead.
DTYPE_KINDS: tuple[str, ...] = ("logical", "part")
#: "part" rows on a real array: `real` is the array itself (no primitive: the `copy` rule),
#: `imag` is `zeros_like` (a constructor: Varying kept, Unreduced and Reduced dropped)
REAL_PARTS: dict[str, str] = {"real": "copy", "imag": "zeros_like"}


def dtype_rule(kind: str | None, rule: str, operands: Sequence[tuple[Operand, object]],
               features: Features = CONSERVATIVE, *, op: str) -> str:
    """The rule a row of dtype kind `kind` (`DTYPE_KINDS`, None: none) applies to `operands`,
    each (state or LITERAL, dtype name or `UNKNOWN`): `rule`, or the one `jax.numpy`'s
    implementation applies for those dtypes (an `ELEMENTWISE` key, or a `LIKE_CONSTRUCTORS`
    name for `imag` of a real array). A "logical" operand that is not boolean must pass the
    comparison with zero (its `ne` rule's error otherwise). With an `UNKNOWN` dtype (the static
    view) the row's own rule."""
    if kind == "logical":
        for t, dtype in operands:
            if isinstance(t, SpmdType) and dtype is not UNKNOWN and _kind(dtype) != "b":
                combine("ne", [t, INVARIANT], features, op=op)
        return rule
    if kind == "part":
        t, dtype = operands[0]
        if isinstance(t, SpmdType) and dtype is not UNKNOWN and _kind(dtype) != "c":
            return REAL_PARTS[rule]
        return rule
    assert kind is None, kind
    return rule

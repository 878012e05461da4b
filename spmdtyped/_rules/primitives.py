"""jaxpr primitives -> rule rows (elementwise and structural), for the walk of traced jaxprs.
Names are jax 0.12's; `_compat.primitive_name` maps other versions' spellings (0.10:
`vary_unreduced_cast_p`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .arguments import UNKNOWN, argument_rule

# collective/cast primitives: each collective's row in `_surface.collectives` (`primitives`)

#: primitives that return their operand as it is, on every device: a copy,
#: `checkpoint_name`'s `name` (a remat policy's tag), and the placement of a value over the
#: mesh's auto axes inside a shard_map over the others (`jax.lax.with_sharding_constraint`,
#: `jax.sharding.reshard`, `mesh_cast`: each binds one equation per leaf). Every walk follows
#: them as the `copy` rule: the state, the refinement (Shard / Partial / Rep), the share and
#: the content facts pass through.
#: The `done` of an asynchronous collective (jax 0.12: `jax.lax.psum_scatter_start(...)`,
#: `.done()`) is one too: it returns the value its start computed, which the start's row
#: (`_surface.collectives`, `primitives`: `psum_invariant_start` is `psum`'s) has typed.
ASYNC_DONES = frozenset({"all_gather_done", "psum_done", "reduce_scatter_done",
                         "all_to_all_done", "ppermute_done"})
IDENTITIES = frozenset({"copy", "copy_p", "name", "sharding_constraint",
                        "with_sharding_constraint", "reshard", "mesh_cast", *ASYNC_DONES})

#: elementwise/structural primitive -> ELEMENTWISE rule
PRIMITIVES: dict[str, str] = {
    "add": "add", "add_any": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg",
    "dot_general": "matmul", "select_n": "where",
    # n-ary structural ops: U only with U on the same axes, like add (JAX's nary reduced rule)
    "concatenate": "concatenate", "dynamic_update_slice": "add",
    "scatter-add": "at_add", "scatter_add": "at_add", "scatter-mul": "at_mul",
    "scatter_mul": "at_mul", "scatter-min": "at_min", "scatter_min": "at_min",
    "scatter-max": "at_max", "scatter_max": "at_max",
    "max": "maximum", "min": "minimum", "pow": "pow", "atan2": "arctan2", "rem": "mod",
    "clamp": "maximum", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
    "and": "and", "or": "or", "xor": "xor", "not": "logical_not",
    "exp": "exp", "exp2": "exp", "log": "log", "tanh": "tanh", "sin": "sin", "cos": "cos",
    "tan": "sin", "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "abs", "square": "square",
    "sign": "sign", "log1p": "log1p", "expm1": "expm1", "logistic": "sigmoid", "erf": "erf",
    "floor": "floor", "ceil": "ceil", "round": "round", "is_finite": "isfinite",
    "integer_pow": "integer_pow", "cumsum": "cumsum", "cumprod": "cumprod",
    "cummax": "cummax", "cummin": "cummin", "cumlogsumexp": "cumprod", "rev": "flip",
    "argmax": "argmax", "argmin": "argmin", "reduce_prod": "prod", "reduce_sum": "sum",
    "reduce_max": "max", "reduce_min": "min", "sort": "sort",
    "gather": "take", "scatter": "at_set", "dynamic_slice": "dynamic_slice",
    "reshape": "reshape", "transpose": "transpose", "squeeze": "squeeze",
    "expand_dims": "expand_dims", "broadcast_in_dim": "broadcast_to", "slice": "getitem",
    "pad": "pad", "convert_element_type": "astype", "reduce_precision": "astype",
    **{p: "copy" for p in IDENTITIES}, "split": "split", "conj": "conj", "real": "real",
    "imag": "imag",
    "tile": "tile",  # jax 0.12.1 (earlier versions: broadcast_in_dim and reshape)
}

#: primitives whose rule types only their first N operands (the rest are indices, padding
#: values, shapes); the others type every operand. `select_n(pred, *cases)` types
#: (pred, *cases[::-1]), so that `where`'s last operand is JAX's first case, as in
#: `jnp.where(c, x, y)`.
PRIMITIVE_OPERANDS: dict[str, int] = {
    **{p: 1 for p in ("pad", "dynamic_slice", "gather", "scatter", "scatter-add", "scatter_add",
                      "scatter-mul", "scatter_mul", "scatter-min", "scatter_min", "scatter-max",
                      "scatter_max", "sort", "split", "rev",
                      "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "argmax",
                      "argmin", "integer_pow")},
    "dynamic_update_slice": 2,
}

#: primitives whose row depends on their arguments, chosen by `arguments.argument_rule` (the
#: rule `st.numpy.pad` / `.astype` apply): `pad`'s padding value (operand 1), and
#: `convert_element_type`'s target dtype (`new_dtype`, a NumPy name) against the input's.
#: Where an argument cannot be read (a padding value computed at run time) the row that is
#: not linear: strict, never looser.
ARGUMENT_PRIMITIVES: dict[str, str] = {"pad": "pad_affine", "convert_element_type": "astype_nonlinear"}


def primitive_rule(name: str, params: Mapping[str, object], values: Sequence[object],
                   dtype: object = UNKNOWN) -> str:
    """The `ELEMENTWISE` row of primitive `name` (a `PRIMITIVES` key) for its parameters, its
    operands' values where they are literals (`UNKNOWN` otherwise) and its first operand's
    dtype name."""
    rule = PRIMITIVES[name]
    if name == "pad":
        keywords: dict[str, object] = {
            "mode": "constant", "constant_values": values[1] if len(values) > 1 else UNKNOWN}
    elif name == "convert_element_type":
        keywords = {"dtype": params.get("new_dtype", UNKNOWN)}
    else:
        return rule
    row = argument_rule(rule, keywords, dtype)
    return row if row is not None else ARGUMENT_PRIMITIVES[name]


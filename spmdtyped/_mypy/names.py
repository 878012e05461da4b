"""The full names `spmdtyped.mypy_plugin` dispatches on, for the feature modules that only some
programs use (control flow, autodiff, `shard_map`, custom ops, `st.numpy` / `st.nn`, `jax.jit`
and `functools.partial` wrappers): the entry point reads them here and imports such a module on
the first name of its that mypy asks about (a mypy run pays for the plugin code it uses, which
matters where Python compiles every module from source: `PYTHONDONTWRITEBYTECODE`).

The feature modules re-export their tables from here (`control.FULLNAMES`, ...). Operators,
collectives and hints are used by every program and dispatch on their own tables.
"""

from __future__ import annotations

from typing import Final

from .. import _surface
from .convert import STATIC

#: `st.fori_loop`, `while_loop`, `scan`, `cond`, `switch` (`control`)
CONTROL: Final = {f"spmdtyped.{m}{n}": n for m in ("", "_ops.control.")
                  for n in ("fori_loop", "while_loop", "scan", "cond", "switch")}
#: `st.grad`, `st.value_and_grad`, `st.vjp` (`autodiff`)
AUTODIFF: Final = {f"{m}.{n}": n for m in ("spmdtyped", "spmdtyped._ops.autodiff")
                   for n in ("grad", "value_and_grad", "vjp")} | {
    "jax.vmap": "vmap", "jax._src.api.vmap": "vmap",
    # `jax.grad` of a typed loss is `st.grad`'s at runtime (`_ops.autodiff`): typed the same
    # where the loss is typed, else JAX's own
    **{f"{m}.{n}": f"jax.{n}" for m in ("jax", "jax._src.api") for n in ("grad", "value_and_grad")}}
#: the calls of `st.grad(lambda ...: ...)` & co. at once (`autodiff.lambda_call`): the names
#: mypy gives them (`autodiff._grad_name`: a lambda is "fun"; `jax.grad` of a lambda keeps
#: JAX's unnamed `Callable`, whose call reaches no plugin hook)
GRAD_LAMBDA_CALLS: Final = ("st.grad(fun", "st.value_and_grad(fun")
#: the calls of any gradient function (`autodiff.grad_call`: SPMD407 in the body of a function
#: `jax.vmap` maps)
GRAD_CALLS: Final = ("st.grad(", "st.value_and_grad(", "jax.grad(", "jax.value_and_grad(")
#: `jax.vmap(st.grad(...))`'s call (`autodiff.vmap_call`: SPMD407)
VMAP_OF_GRAD: Final = f"{STATIC}.VmapOfGrad"
VMAP_CALL: Final = f"{VMAP_OF_GRAD}.__call__"
#: `st.shard_map` and its results' `__call__` (`boundary`)
OUT_SPEC_MISMATCH: Final = f"{STATIC}.OutSpecMismatch"
SHARD_MAP_DECORATOR: Final = f"{STATIC}.ShardMapDecorator"
SHARD_MAP: Final = frozenset({f"{m}.shard_map" for m in (STATIC, "spmdtyped", "spmdtyped._boundary.shard_map")})
BOUNDARY_METHODS: Final = {f"{OUT_SPEC_MISMATCH}.__call__": "call",
                           f"{SHARD_MAP_DECORATOR}.__call__": "decorate"}
#: `st.custom_op` / `st.opaque` and a declared op's `__call__` (`custom`)
CUSTOM_OP: Final = frozenset({"spmdtyped.custom_op", "spmdtyped._ops.custom.custom_op"})
OPAQUE: Final = frozenset({"spmdtyped.opaque", "spmdtyped._ops.custom.opaque"})
CUSTOM_OP_CLASS: Final = "spmdtyped._ops.custom.CustomOp"
CUSTOM_CALL: Final = f"{CUSTOM_OP_CLASS}.__call__"
#: calls through `jax.jit(f)` and `functools.partial(f, ...)` (`wrappers`)
WRAPPED_CALLS: Final = frozenset({"jax._src.pjit.JitWrapped.__call__", "jax._src.stages.Wrapped.__call__",
                                  "functools.partial.__call__"})
#: `st.numpy` / `st.nn` functions: full name -> (module label, name, rule, binding) (`functions`)
FUNCTIONS: Final = {f"spmdtyped.{r.kind}.{r.name}": (r.kind, r.name, r.rule, r.binding)
                    for r in (*_surface.NUMPY, *_surface.NN) if r.rule is not None}
#: `jax.tree.map` & co.: full name -> how many arguments the mapped function takes before the
#: leaves (`pytrees`: the leaves' types from the trees' static types)
TREE_MAPS: Final = {"jax._src.tree.map": 0, "jax._src.tree_util.tree_map": 0,
                    "jax._src.tree.map_with_path": 1, "jax._src.tree_util.tree_map_with_path": 1}
#: flax's variable class: `param[...]` of an `nnx.Param[Varying["tp"]]` (or of another subclass)
#: is its value's type (`pytrees.variable_item`)
NNX_VARIABLE: Final = "flax.nnx.variablelib.Variable"

# JAX's own spellings of the rows (`jax_forms`): `jnp.exp`, `jax.nn.relu`, `jax.lax.psum`

#: the class JAX's stubs declare `jnp.add`, `jnp.maximum`, ... with: its `__call__`
UFUNC_CALL: Final = "jax.numpy.BinaryUfunc.__call__"


def jax_row(fullname: str) -> _surface.Row | None:
    """The surface row of a JAX function's full name (public or JAX's private spelling)."""
    if not fullname.startswith("jax"):
        return None
    row = _surface.by_jax_name(fullname)
    return row if row is not None and row.rule is not None else None


def jax_collective(fullname: str) -> str | None:
    """`jax.lax.psum` (or `jax._src.lax.parallel.psum`) -> "psum": a collective of the table
    with a typed result, else None."""
    if not fullname.startswith("jax"):
        return None
    public = _surface.jax_public(fullname)
    if not public.startswith("jax.lax."):
        return None
    name = public.removeprefix("jax.lax.")
    c = _surface.collective(name)
    return name if c is not None and (c.ops or name == "axis_index") else None


#: JAX's modules whose functions take typed values at runtime (arrays to JAX)
_WIDENED: Final = ("jax.numpy.", "jax.nn.", "jax.lax.")


def jax_widened(fullname: str) -> bool:
    """Whether a JAX function's parameters accept typed values statically (`jax_forms.widen`):
    every `jax.numpy`, `jax.nn` and `jax.lax` function; a row's result is typed from the row,
    any other's stays JAX's `jax.Array` (its state unknown)."""
    return fullname.startswith("jax") and _surface.jax_public(fullname).startswith(_WIDENED)

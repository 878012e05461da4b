"""Pytree classes and `jax.tree.map`: what the fields of an `eqx.Module`, a flax nnx `Module`,
a dataclass or a NamedTuple say, and the leaves of a tree's static type.

- **Constructors** (`constructor`, a signature hook on the class): a parameter hinted with a
  state (`w: Varying["tp"]`, `st.Shard["tp", -1]`, `Optional[Invariant]`) also takes what such a
  field holds outside `st.shard_map`: a `jax.typing.ArrayLike` (a global `jax.Array`, a NumPy
  array, a scalar) or a `PartitionSpec` (the module as its own spec tree, as
  `jax.tree.map(jax.device_put, model, specs)` wants). The hint is a claim that `st.shard_map`
  checks where the module enters the body (SPMD403), as it is for a parameter; a typed value of
  another state is still mypy's `arg-type`. Inside a method `self.w` has the field's declared
  type (mypy's own reading of the class).
- **Leaves** (`leaves`): the types of the array leaves of a static type: a typed value, a
  `jax.Array`, a tuple / NamedTuple / list / dict / `Sequence` / `Mapping` of them, an
  `Optional`, a flax `Variable` (`nnx.Param[Varying["tp"]]`) and the fields of the classes above
  (nested; a dataclass is taken to be registered as a pytree, `jax.tree_util.register_dataclass`,
  which mypy cannot see once the class comes from the cache). Fields of other types (ints,
  dtypes, callables: static in equinox) are not array leaves.
- **`jax.tree.map(f, tree, *rest)`** (and `jax.tree_util.tree_map`, the `_with_path` forms:
  `tree_map_signature`, `tree_map`): a `lambda` `f` takes the union of each tree's leaf types, so
  its body is checked (`jax.tree.map(lambda g: st.pmean(g, "dp"), grads)`); the result is the
  first tree's structure with the lambda's result as leaves (a class: the class itself). Only
  where some leaf is a typed value, no `is_leaf` is given and `f` is a lambda or a helper of the
  module with parameters of no state (`jax.tree.map(average, grads)`: its body checked on the
  leaf types, `_helper_result`); another `def` keeps its own signature, checked by mypy as
  before. A class-typed tree after the first gives `Any` leaves: a module of the same class is often its spec tree (`jax.tree.map(lambda a, s: ...,
  model, specs)`), whose leaves are `PartitionSpec`s.
- **A flax variable's value** (`variable_item`): `self.w[...]` of an `nnx.Param[Varying["tp"]]`
  is the value's type, as `self.w.value` is (flax types `[...]` `jax.Array` for a
  `Variable[jax.Array]` only, `Any` otherwise); another index keeps flax's type.
- **Gradients of class parameters** (`class_cotangent`, read by `autodiff`): a class whose
  typed leaves are all their own cotangent (no Reduced / Unreduced field) is its own gradient's
  type.
"""

from __future__ import annotations

from typing import Final

from mypy.maptype import map_instance_to_supertype
from mypy.nodes import ARG_POS, EllipsisExpr, Expression, FuncDef, LambdaExpr, RefExpr, TypeInfo, Var
from mypy.plugin import FunctionContext, FunctionSigContext, MethodContext
from mypy.subtypes import is_same_type
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    NoneType,
    TupleType,
    Type,
    UnionType,
    get_proper_type,
)

from .. import _rules
from .._rules import SpmdType
from . import names
from .convert import (
    ARRAY,
    ARRAY_LIKE,
    PARTITION_SPEC,
    any_type,
    contains_sarray,
    is_sarray,
    jax_type,
    map_typed,
    named,
    to_operand,
)

#: base classes whose subclasses are pytrees with attribute fields (flax nnx); dataclasses and
#: `eqx.Module` (a `dataclass_transform`) are read from mypy's dataclass metadata
_NNX_BASES: Final = frozenset({"flax.nnx.pytreelib.Pytree", "flax.nnx.module.Module"})
_ARRAYS: Final = frozenset({f"{ARRAY[0]}.{ARRAY[1]}", "numpy.ndarray"})
_SEQUENCES: Final = frozenset({"builtins.list", "builtins.tuple", "typing.Sequence",
                               "collections.abc.Sequence"})
_MAPPINGS: Final = frozenset({"builtins.dict", "typing.Mapping", "collections.abc.Mapping"})
#: how deep `leaves` follows nested classes (a model of blocks of layers is 3 deep)
_DEPTH: Final = 12


def is_pytree_class(info: TypeInfo) -> bool:
    """A NamedTuple, a dataclass (`eqx.Module` included) or a flax nnx Module / Pytree."""
    if info.tuple_type is not None or "dataclass" in info.metadata:
        return True
    return any(b.fullname in _NNX_BASES for b in info.mro[1:])


# ------------------------------------------------------------------------- constructors


def constructor(ctx: FunctionSigContext) -> FunctionLike:
    """A pytree class's constructor: each state-hinted parameter also takes an ArrayLike or a
    PartitionSpec (see the module docstring)."""
    sig = ctx.default_signature
    if not isinstance(sig, CallableType) or not any(contains_sarray(t) for t in sig.arg_types):
        return sig
    claims = [t for t in (jax_type(ctx.api, ARRAY_LIKE), jax_type(ctx.api, PARTITION_SPEC))
              if t is not None]
    if not claims:
        return sig

    def claim(s: Instance) -> Type:
        return UnionType.make_union([s, *claims])

    return sig.copy_modified(arg_types=[map_typed(t, claim, covariant=True) for t in sig.arg_types])


# ------------------------------------------------------------------------- leaves


def _fields(info: TypeInfo) -> list[Type]:
    """The declared types of a pytree class's fields (unknown ones `Any`)."""
    if info.tuple_type is not None:
        return list(info.tuple_type.items)
    if "dataclass" in info.metadata:
        names = [a["name"] for a in info.metadata["dataclass"].get("attributes", [])]
    else:  # flax nnx: the attributes the class and its bases (not flax's) assign
        names = list(dict.fromkeys(
            n for base in info.mro if not base.fullname.startswith(("flax.", "builtins."))
            for n, sym in base.names.items()
            if isinstance(sym.node, Var) and not sym.node.is_classvar and not n.startswith("__")))
    out: list[Type] = []
    for n in names:
        sym = info.get(n)
        node = sym.node if sym is not None else None
        if isinstance(node, Var):
            out.append(node.type if node.type is not None else any_type())
    return out


def leaves(t: Type, *, fields: bool = True, depth: int = 0) -> list[Type]:
    """The array leaf types of a static type (see the module docstring); a class when not
    `fields` (a tree after the first of `jax.tree.map`) gives `Any`."""
    p = get_proper_type(t)
    if depth > _DEPTH:
        return [any_type()]
    if isinstance(p, AnyType) or is_sarray(p):
        return [p]
    if isinstance(p, TupleType):
        return [leaf for i in p.items for leaf in leaves(i, fields=fields, depth=depth + 1)]
    if isinstance(p, UnionType):
        return [leaf for i in p.items for leaf in leaves(i, fields=fields, depth=depth + 1)]
    if not isinstance(p, Instance):
        return []  # None, callables, literals: no array leaf
    name = p.type.fullname
    if name in _ARRAYS:
        return [p]
    if name in _SEQUENCES and p.args:
        return leaves(p.args[0], fields=fields, depth=depth + 1)
    if name in _MAPPINGS and p.args:
        return leaves(p.args[-1], fields=fields, depth=depth + 1)
    if p.type.has_base(names.NNX_VARIABLE):
        return leaves(p.args[0], fields=fields, depth=depth + 1) if p.args else [any_type()]
    if is_pytree_class(p.type):
        if not fields or p.type.defn.type_vars:
            return [any_type()]
        return [leaf for f in _fields(p.type) for leaf in leaves(f, depth=depth + 1)]
    return []  # a scalar, a dtype, a string: static, not an array leaf


def _union(types: list[Type]) -> Type:
    out: list[Type] = []
    for t in types:
        if not any(is_same_type(t, o) for o in out):
            out.append(t)
    return out[0] if len(out) == 1 else UnionType.make_union(out)


def _leaf_type(t: Type, *, first: bool) -> Type | None:
    """The union of a tree's leaf types where some leaf is a typed value, else None."""
    found = leaves(t, fields=first)
    return _union(found) if any(is_sarray(f) for f in found) else None


# ------------------------------------------------------------------------- jax.tree.map


def _formals(names: list[str | None]) -> tuple[int, int, int | None, int | None] | None:
    try:
        f, tree = names.index("f"), names.index("tree")
    except ValueError:
        return None
    rest = names.index("rest") if "rest" in names else None
    is_leaf = names.index("is_leaf") if "is_leaf" in names else None
    return f, tree, rest, is_leaf


def tree_map_signature(ctx: FunctionSigContext, lead: int) -> FunctionLike:
    """`jax.tree.map(lambda ...: ..., tree, *rest)`: the lambda takes the trees' leaf types."""
    sig = ctx.default_signature
    if not isinstance(sig, CallableType):
        return sig
    where = _formals(list(sig.arg_names))
    if where is None:
        return sig
    f, tree, rest, is_leaf = where
    if is_leaf is not None and ctx.args[is_leaf]:
        return sig
    if not (ctx.args[f] and ctx.args[tree]):
        return sig
    fun_expr = ctx.args[f][0]
    lam = isinstance(fun_expr, LambdaExpr)
    if not (lam or _helper(fun_expr)):
        return sig
    trees = [*ctx.args[tree], *(ctx.args[rest] if rest is not None else [])]
    with ctx.api.msg.filter_errors():  # type: ignore[attr-defined]
        types = [ctx.api.get_expression_type(e) for e in trees]
    leaf_types = [_leaf_type(t, first=i == 0) for i, t in enumerate(types)]
    if all(lt is None for lt in leaf_types):
        if lam:
            from . import unknown  # `spmd-unknown`: the lambda's leaves are Any

            unknown.tree_map(ctx.api, fun_expr, trees[0], ctx.context)
        return sig
    params: list[Type] = [*([any_type()] * lead), *(lt or any_type() for lt in leaf_types)]
    fun = CallableType(params, [ARG_POS] * len(params), [None] * len(params), any_type(),
                       named(ctx.api, "builtins.function", []))
    # the first tree keeps its own type as its context (a `{"w": w}` display is `dict[Any, Any]`
    # in JAX's `Any` context: the result's structure is read from it)
    formals: dict[int, Type] = {f: fun} if lam else {}  # a helper keeps its own signature
    if leaf_types[0] is not None:
        formals[tree] = types[0]
    return sig.copy_modified(arg_types=[formals.get(i, t) for i, t in enumerate(sig.arg_types)])


def _rebuilt(t: Type, leaf: Type) -> Type | None:
    """`t`'s structure with every array leaf `leaf` (None: a class whose leaves are not
    arrays, or a structure not followed)."""
    p = get_proper_type(t)
    if is_sarray(p) or isinstance(p, AnyType) or (isinstance(p, Instance) and p.type.fullname in _ARRAYS):
        return leaf
    if isinstance(p, NoneType):
        return p
    if isinstance(p, TupleType):
        items = [_rebuilt(i, leaf) for i in p.items]
        return None if any(i is None for i in items) else p.copy_modified(
            items=[i for i in items if i is not None])
    if isinstance(p, UnionType):
        items = [_rebuilt(i, leaf) for i in p.items]
        return None if any(i is None for i in items) else UnionType.make_union(
            [i for i in items if i is not None])
    if isinstance(p, Instance) and p.args and (p.type.fullname in _SEQUENCES | _MAPPINGS):
        inner = _rebuilt(p.args[-1], leaf)
        return None if inner is None else p.copy_modified(args=[*p.args[:-1], inner])
    if isinstance(p, Instance) and (is_pytree_class(p.type) or p.type.has_base(names.NNX_VARIABLE)):
        # the same class, holding arrays (its fields' hints are the claim the boundary checks)
        lp = get_proper_type(leaf)
        arrays = is_sarray(lp) or (isinstance(lp, Instance) and lp.type.fullname in _ARRAYS)
        return p if arrays else None
    return p if not leaves(p) else None


def tree_map(ctx: FunctionContext, lead: int) -> Type:
    """The result of `jax.tree.map(lambda ...: ..., tree, ...)`: see the module docstring."""
    where = _formals(list(ctx.callee_arg_names))
    if where is None:
        return ctx.default_return_type
    f, tree, rest, is_leaf = where
    if (is_leaf is not None and ctx.args[is_leaf]) or not (ctx.args[f] and ctx.args[tree]):
        return ctx.default_return_type
    tree_t = ctx.arg_types[tree][0]
    if _leaf_type(tree_t, first=True) is None:
        return ctx.default_return_type
    if isinstance(ctx.args[f][0], LambdaExpr):
        ft = get_proper_type(ctx.arg_types[f][0])
        ret = ft.ret_type if isinstance(ft, CallableType) else None
    else:  # `jax.tree.map(average, grads)` of a helper of the module: its body on the leaves
        ret = _helper_result(ctx, ctx.args[f][0], lead,
                             [*ctx.arg_types[tree], *(ctx.arg_types[rest] if rest is not None else [])])
    if ret is None or isinstance(get_proper_type(ret), AnyType):
        return ctx.default_return_type
    out = _rebuilt(tree_t, ret)
    return out if out is not None else ctx.default_return_type


def _helper(f: Expression) -> FuncDef | None:
    """A function of the user's with parameters of no state (`calls.definition`), named."""
    if not (isinstance(f, RefExpr) and isinstance(f.node, FuncDef)):
        return None
    from . import calls

    return calls.definition(f.node)


def _helper_result(ctx: FunctionContext, f: Expression, lead: int, trees: list[Type]) -> Type | None:
    """The result of a helper of the module with parameters of no state (`_helper`) mapped
    over `trees`: its body checked on their leaf types, its rule errors reported at the call
    (`calls.check_mapped`); None for any other function."""
    from . import calls

    defn = _helper(f)
    if defn is None:
        return None
    leaf_types = [_leaf_type(t, first=i == 0) or any_type() for i, t in enumerate(trees)]
    return calls.check_mapped(ctx, defn, [*([any_type()] * lead), *leaf_types])


# ------------------------------------------------------------------------- flax variables


def variable_item(ctx: MethodContext) -> Type:
    """`v[...]` of a flax `Variable` (`nnx.Param[Varying["tp"]]`): the value's type where it
    is a typed value (see the module docstring)."""
    p = get_proper_type(ctx.type)
    if not (isinstance(p, Instance) and len(ctx.args) == 1 and len(ctx.args[0]) == 1
            and isinstance(ctx.args[0][0], EllipsisExpr)):
        return ctx.default_return_type
    base = next((b for b in p.type.mro if b.fullname == names.NNX_VARIABLE), None)
    value = map_instance_to_supertype(p, base).args if base is not None else ()
    return value[0] if value and is_sarray(value[0]) else ctx.default_return_type


# ------------------------------------------------------------------------- gradients


def class_cotangent(t: Type) -> Type | None:
    """A pytree class instance as its own gradient's type, when each typed leaf is its own
    cotangent (`_rules.cotangent`: no Reduced or Unreduced field); else None."""
    p = get_proper_type(t)
    if not (isinstance(p, Instance) and is_pytree_class(p.type) and p.type.tuple_type is None):
        return None
    found = leaves(p)
    if not any(is_sarray(f) for f in found):
        return None
    for f in found:
        o = to_operand(f) if is_sarray(f) else None
        if is_sarray(f) and not (isinstance(o, SpmdType) and _rules.cotangent(o) == o):
            return None
    return p

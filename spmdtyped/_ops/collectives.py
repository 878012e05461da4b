"""Typed collectives and casts, with jax.lax's names, argument order and keywords.

Each call: normalise and validate the axis names -> compute the result state with `_rules`
(raising before any JAX primitive is bound) -> bind through `_compat` -> in check mode,
compare JAX's resulting state with the prediction. Inputs may be typed or raw JAX values,
or pytrees of them; outputs are typed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax

from .. import _compat, _rules, _surface, _validate
from .._errors import error
from .._rules import axis_size as axis_size_rule
from .._rules.refine import shape as refine_shape
from .._typed import memo as _memo
from .._typed import refining as _refining
from .._typed.array import array_operand, checked, in_vma_off, is_typed


def _axes(axis_name: Any, op: str) -> tuple[str, ...]:
    """The mesh axes of `axis_name`, checked; names bound by an enclosing `jax.vmap` are left
    out (they are not mesh axes: the manual-axis states do not change over them)."""
    axes = _rules.normalize_axes(axis_name, op)
    mesh_axes, manual = _compat.current_mesh()
    batch = _compat.batch_axis_names(mesh_axes)
    mesh_part = tuple(a for a in axes if a not in batch)
    vmapped = [a for a in axes if a in batch]
    if vmapped and manual and not in_vma_off() and op not in ("st.axis_index", "st.axis_size"):
        raise error("SPMD503", f"{op}: {vmapped[0]!r} is a jax.vmap axis; inside a shard_map "
                    f"with check_vma=True JAX cannot bind a collective over it (jax 0.10 and 0.12 "
                    f"fail with a bare AssertionError in pvary)", axes=tuple(vmapped), op=op,
                    fix="reduce the batch dimension outside the vmap (x.sum(axis=0)), move the "
                        "vmap outside the shard_map, or use st.shard_map(..., check_vma=False)")
    if not mesh_part:
        return ()
    if not manual:
        raise error("SPMD506", f"{op}: called outside shard_map (no manual mesh axes in scope)",
                    op=op, fix="call it inside a function given to st.shard_map")
    _rules.check_axes_known(mesh_part, op, manual, mesh_axes)
    return mesh_part


def _jax_axes(axis_name: Any) -> Any:
    return axis_name if isinstance(axis_name, str) else _rules.normalize_axes(axis_name, "jax")


def _leaves_map(fn: Callable[[Any], Any], x: Any) -> Any:
    if is_typed(x):  # one typed value, the common case: no pytree walk
        return fn(x)
    return jax.tree_util.tree_map(fn, x, is_leaf=is_typed)


def _no_groups(axis_index_groups: Any, op: str) -> None:
    if axis_index_groups is not None:
        raise error("SPMD502", f"{op}: axis_index_groups is not supported under check_vma (JAX "
                    f"raises a bare NotImplementedError or types the result wrongly)", op=op,
                    fix="split the mesh axis into two axes and reduce over one of them")


def _axis_op(collective: _surface.Collective, x: Any, axis_name: Any,
             bind: Callable[[Any, tuple[str, ...] | str], Any], to: object = None,
             params: dict[str, Any] | None = None) -> Any:
    """`st.<name>(x, axis_name, ..., to=to)`: the `AXIS_OPS` row of its collective-table row
    (`_surface.Collective.op`), applied leaf by leaf. `params`: the collective's parameters the
    refinement reads (`scatter_dimension`, `tiled`, `axis`, `split_axis`)."""
    op = f"st.{collective.name}"
    rule = collective.op(to, op)
    # (the row and its rule by identity: a row registered again, or a rule replaced, is a
    # new key)
    key = _leaf_key((collective, _rules.AXIS_OPS.get(rule), op, to), axis_name, x, params)
    got = None if key is None else _memo.COLLECTIVES.get(key)
    if got is not None:  # a repeated layer's collective: bound and compared, nothing more
        jax_axis, out_t, ref = got
        return checked(op, bind(x.raw, jax_axis), out_t, ref)
    axes = _axes(axis_name, op)
    jax_axis = _jax_axes(axis_name)

    def one(leaf: Any) -> Any:
        if isinstance(leaf, (str, bytes)):
            raise _validate.not_an_array(leaf, op)
        raw, t = array_operand(leaf)
        if not axes:  # only jax.vmap axes: JAX's batching rule; the manual states are unchanged
            return checked(op, bind(raw, jax_axis), t)
        out_t = _rules.axis_op(rule, t, axes, _compat.FEATURES, op=op)
        if out_t.unreduced or out_t.reduced:
            _full_manual_only(op)
        out = bind(raw, jax_axis)
        # the Shard/Partial/Rep refinement of the result (SPMD108: a psum of a shard)
        ref = refine_shape.collective(rule, t, _refining.of(leaf), out_t, axes,
                                      shape=_refining.shape_of(leaf), op=op, params=params)
        if key is not None and leaf is x:
            _memo.keep(_memo.COLLECTIVES, key, (jax_axis, out_t, ref))
        return checked(op, out, out_t, ref)

    return _leaves_map(one, x)


def _leaf_key(head: tuple[Any, ...], axis_name: Any, x: Any, params: dict[str, Any] | None
              ) -> tuple[Any, ...] | None:
    """What typing a collective of one typed value `x` over `axis_name` reads: `head` (the
    collective's row and rule, its name, `to=`), the axis names, the enclosing mesh's axes,
    manual axes and `jax.vmap` axes, the refinement's parameters (each with its type), and
    what `_memo.operands_key` reads of `x` (state class, refinement, local shape, `st.allow`
    codes, `check_vma`). None (type it afresh) for a pytree, or an axis name or parameter
    that is not a string / number / tuple of strings."""
    if not is_typed(x) or not (type(axis_name) is str or type(axis_name) is tuple
                               and all(type(a) is str for a in axis_name)):
        return None
    if params and not all(_memo.static(v) for v in params.values()):
        return None
    mesh = _compat.current_mesh()
    typed_params = tuple((k, type(v), v) for k, v in params.items()) if params else ()
    return _memo.operands_key((*head, axis_name, mesh, _compat.batch_axis_names(mesh[0]),
                               typed_params), (x,), in_vma_off())


def _full_manual_only(op: str) -> None:
    mesh_axes, manual = _compat.current_mesh()
    _rules.check_full_manual_value(manual, mesh_axes, op=op)


def call(name: str, x: Any, axis_name: Any, args: dict[str, Any]) -> Any:
    """`st.<name>(x, axis_name, **args)` by its row of the collective table: the
    `axis_index_groups` check, the `AXIS_OPS` row (`to=` where it picks one), the binding
    (`Collective.bind`, else JAX's function) called with the row's parameters in JAX's order."""
    c = _surface.collective(name)
    assert c is not None and c.ops, name
    op = f"st.{name}"
    if "axis_index_groups" in args:
        _no_groups(args["axis_index_groups"], op)
    fn, check, positional_names, keyword_names, refined = _binding(c)
    positional = [args[n] for n in positional_names]
    keywords = {**{n: args[n] for n in keyword_names}, **c.fixed}

    def bind(r: Any, a: Any) -> Any:
        if check is not None:
            check(r, a, args, op)
        return fn(r, a, *positional, **keywords)

    params = {n: args[n] for n in refined}
    return _axis_op(c, x, axis_name, bind, args.get("to") if c.select else None, params or None)


@functools.cache
def _binding(c: _surface.Collective) -> tuple[Callable[..., Any], Callable[..., Any] | None,
                                              tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """A row's binding (`Collective.bind`, else JAX's function), its `check`, and the names of
    its positional, keyword and refinement parameters (rows compare by identity: a row
    registered again is a new key)."""
    return (_compat.resolve(c.bind or c.jax), _compat.resolve(c.check) if c.check else None,
            tuple(p.name for p in c.params if not p.keyword),
            tuple(p.name for p in c.params if p.keyword),
            tuple(p.name for p in c.params if p.refine))


def make(c: _surface.Collective, *, module: str = __name__,
         body: str = "call({name!r}, x, axis_name, {args})",
         scope: dict[str, Any] | None = None, doc: str | None = None) -> Callable[..., Any]:
    """A function with the row's signature (JAX's order, keywords and defaults) whose body is
    `return <body>` (formatted with `name` and `args`: the parameters as a dict display),
    evaluated in `scope` (default: `call`); its docstring is `doc` (default: the row's).
    `spmdtyped.lax` makes its drop-ins with this too."""
    params = ["x", "axis_name"] if c.ops else ["axis_name"]
    for i, p in enumerate(c.params):
        if p.keyword and not any(q.keyword for q in c.params[:i]):
            params.append("*")
        params.append(p.name if p.default is _surface.REQUIRED else f"{p.name}=_d_{p.name}")
    args = "{" + ", ".join(f"{p.name!r}: {p.name}" for p in c.params) + "}"
    src = (f"def {c.name}({', '.join(params)}):\n"
           f"    return " + body.format(name=c.name, args=args) + "\n")
    names: dict[str, Any] = {"call": call} if scope is None else dict(scope)
    names.update({f"_d_{p.name}": p.default for p in c.params})
    exec(compile(src, f"<{module}.{c.name}>", "exec"), names)  # noqa: S102
    fn = names[c.name]
    fn.__module__ = module
    fn.__qualname__ = c.name
    fn.__doc__ = c.doc if doc is None else doc
    return fn  # type: ignore[no-any-return]


def bind_all_gather(x: Any, axis_name: Any, *, axis_index_groups: Any = None, axis: int = 0,
                    tiled: bool = False, to: str = "varying") -> Any:
    """`st.all_gather`'s binding: with check_vma=False every value is Invariant to JAX; gather
    plainly (same data and program)."""
    return _compat.all_gather(x, axis_name, axis=axis, tiled=tiled,
                              to="varying" if in_vma_off() else to,
                              axis_index_groups=axis_index_groups)


def bind_cast(r: Any, a: Any, *, to: str) -> Any:
    """The casts' binding (`st.pcast`, `st.pvary`): no-ops under check_vma=False (where
    JAX's `to='unreduced'` raises); a Python scalar cast to Reduced goes through `asarray`."""
    if in_vma_off():
        return r
    if to == "reduced" and (isinstance(r, (int, float)) or not hasattr(r, "dtype")):
        r = _compat.asarray_like(r, r)  # reference Q13: bare AssertionError on scalars
    return _compat.pcast(r, a, to=to)


def _ndim(r: Any) -> int | None:
    nd = getattr(r, "ndim", None)
    return nd if isinstance(nd, int) else None


def _shape(r: Any) -> tuple[int, ...] | None:
    shape = getattr(r, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else None


# The rows' `check`s: the arguments validated against the value and the axis before binding.
def check_perm(r: Any, a: Any, args: dict[str, Any], op: str) -> None:
    _validate.perm_arg(args["perm"], _compat.axis_size(a), op, a)


def check_shuffle(r: Any, a: Any, args: dict[str, Any], op: str) -> None:
    _validate.shuffle_arg(args["perm"], _compat.axis_size(a), op, a)


def check_gather(r: Any, a: Any, args: dict[str, Any], op: str) -> None:
    # the gathered dimension: an existing one when tiled, else one more (JAX inserts it)
    nd = _ndim(r)
    _validate.dim_arg(args["axis"], None if nd is None else nd + (not args["tiled"]), op, "axis")


def check_scatter(r: Any, a: Any, args: dict[str, Any], op: str) -> None:
    d = args["scatter_dimension"]
    _validate.dim_arg(d, _ndim(r), op, "scatter_dimension")
    _validate.divisible(_shape(r), d, _compat.axis_size(a), op, "scatter_dimension", a,
                        tiled=bool(args["tiled"]))


def check_all_to_all(r: Any, a: Any, args: dict[str, Any], op: str) -> None:
    _validate.dim_arg(args["split_axis"], _ndim(r), op, "split_axis")
    _validate.dim_arg(args["concat_axis"], _ndim(r), op, "concat_axis")
    _validate.divisible(_shape(r), args["split_axis"], _compat.axis_size(a), op, "split_axis", a,
                        tiled=bool(args["tiled"]))


def axis_index(axis_name: Any) -> Any:
    """Typed `jax.lax.axis_index`: an int32 scalar, Varying on the named axes."""
    axes = _axes(axis_name, "st.axis_index")
    raw = _compat.axis_index(_jax_axes(axis_name))
    return checked("st.axis_index", raw, _rules.axis_index_type(axes), refine_shape.axis_index(axes))


def axis_size(axis_name: Any) -> int:
    """`jax.lax.axis_size`: the number of devices along the named axes (a Python int)."""
    axes = _axes(axis_name, "st.axis_size")
    size = _compat.axis_size(_jax_axes(axis_name))
    if len(axes) != len(_rules.normalize_axes(axis_name, "st.axis_size")):
        return size  # a jax.vmap axis among them: not a count of devices
    # an int that remembers its axes: `b / st.axis_size("tp")` is a share of a partial sum
    return axis_size_rule.AxisSize(size, axes)


#: the functions made from the built-in rows (`make`); a row registered later is made on first
#: use (`__getattr__`), for as long as it is in the table
_MADE: dict[str, tuple[_surface.Collective, Callable[..., Any]]] = {}
for _c in _surface.COLLECTIVES:
    if _c.ops:
        globals()[_c.name] = make(_c)


def __getattr__(name: str) -> Any:
    c = _surface.collective(name)
    if c is None or not c.ops:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    made = _MADE.get(name)
    if made is None or made[0] is not c:
        made = _MADE[name] = (c, make(c))
    return made[1]


#: every collective and cast of the surface table (`_surface.COLLECTIVE_NAMES`)
__all__ = sorted(_surface.COLLECTIVE_NAMES)  # noqa: PLE0605
_missing = [n for n in __all__ if n not in globals()]
assert not _missing, f"_ops.collectives lacks surface-table collectives {_missing}"

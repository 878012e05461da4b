"""Typed collectives and casts, with jax.lax's names, argument order and keywords.

Each call: normalise and validate the axis names -> compute the result state with `_rules`
(raising before any JAX primitive is bound) -> bind through `_compat` -> in check mode,
compare JAX's resulting state with the prediction. Inputs may be typed or raw JAX values,
or pytrees of them; outputs are typed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _compat, _refining, _rules, _surface, _validate
from ._array import array_operand, checked, in_vma_off, is_typed
from ._errors import error
from ._rules import axis_size as axis_size_rule
from ._rules import refine_shape


def _axes(axis_name: Any, op: str) -> tuple[str, ...]:
    """The mesh axes of `axis_name`, checked; names bound by an enclosing `jax.vmap` are left
    out (they are not mesh axes: the manual-axis states do not change over them)."""
    axes = _rules.normalize_axes(axis_name, op)
    batch = _compat.batch_axis_names()
    mesh_part = tuple(a for a in axes if a not in batch)
    mesh_axes, manual = _compat.current_mesh()
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
    return jax.tree_util.tree_map(fn, x, is_leaf=is_typed)


def _no_groups(axis_index_groups: Any, op: str) -> None:
    if axis_index_groups is not None:
        raise error("SPMD502", f"{op}: axis_index_groups is not supported under check_vma (JAX "
                    f"raises a bare NotImplementedError or types the result wrongly)", op=op,
                    fix="split the mesh axis into two axes and reduce over one of them")


def _axis_op(name: str, x: Any, axis_name: Any, bind: Callable[[Any, tuple[str, ...] | str], Any],
             to: object = None, params: dict[str, Any] | None = None) -> Any:
    """`st.<name>(x, axis_name, ..., to=to)`: the `AXIS_OPS` row of its surface-table entry
    (`_surface.Collective.op`), applied leaf by leaf. `params`: the collective's parameters the
    refinement reads (`scatter_dimension`, `tiled`, `axis`, `split_axis`)."""
    op = f"st.{name}"
    collective = _surface.collective(name)
    assert collective is not None, name
    rule = collective.op(to, op)
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
        return checked(op, out, out_t, ref)

    return _leaves_map(one, x)


def _full_manual_only(op: str) -> None:
    mesh_axes, manual = _compat.current_mesh()
    _rules.check_full_manual_value(manual, mesh_axes, op=op)


def psum(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """Typed `jax.lax.psum`: Varying or Unreduced on the named axes -> Invariant there.

    **Arguments:** as `jax.lax.psum`; `x` is a typed or raw value or a pytree of them.

    **Returns:** typed values, Invariant on `axis_name`, other axes unchanged.

    **Raises:** `AxisStateError` SPMD101 (Reduced input), SPMD103 (already Invariant: a double
    sum), SPMD104 (mixed states over a tuple of axes); `UsageError` for bad axis names.

    !!! Example
        ```python
        y = st.psum(x, "tp")   # Varying["dp", "tp"] -> Varying["dp"]
        ```
    """
    _no_groups(axis_index_groups, "st.psum")
    return _axis_op("psum", x, axis_name, _compat.psum)


def pmean(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """Typed `jax.lax.pmean` (Varying or Unreduced -> Invariant); see `psum`."""
    _no_groups(axis_index_groups, "st.pmean")
    return _axis_op("pmean", x, axis_name, _compat.pmean)


def pmax(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """Typed `jax.lax.pmax` (Varying -> Invariant; Unreduced of kind max on jax 0.12)."""
    _no_groups(axis_index_groups, "st.pmax")
    return _axis_op("pmax", x, axis_name, _compat.pmax)


def pmin(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """Typed `jax.lax.pmin` (Varying -> Invariant; Unreduced of kind min on jax 0.12)."""
    _no_groups(axis_index_groups, "st.pmin")
    return _axis_op("pmin", x, axis_name, _compat.pmin)


def ppermute(x: Any, axis_name: Any, perm: Sequence[tuple[int, int]]) -> Any:
    """Typed `jax.lax.ppermute`: Varying -> Varying (send shard `src` to device `dst`)."""
    def bind(r: Any, a: Any) -> Any:
        _validate.perm_arg(perm, _compat.axis_size(a), "st.ppermute", a)
        return _compat.ppermute(r, a, perm)

    return _axis_op("ppermute", x, axis_name, bind)


def pshuffle(x: Any, axis_name: Any, perm: Sequence[int]) -> Any:
    """Typed `jax.lax.pshuffle`: Varying -> Varying."""
    def bind(r: Any, a: Any) -> Any:
        _validate.shuffle_arg(perm, _compat.axis_size(a), "st.pshuffle", a)
        return _compat.pshuffle(r, a, perm)

    return _axis_op("pshuffle", x, axis_name, bind)


def pbroadcast(x: Any, axis_name: Any, source: Any) -> Any:
    """Typed `jax.lax.pbroadcast`: Varying -> Varying (JAX types the result Varying).

    JAX has no CPU lowering for pbroadcast; it traces and type-checks everywhere.
    """
    return _axis_op("pbroadcast", x, axis_name,
                    # jax.lax.pbroadcast reads a str axis name as a sequence of one-letter axes
                    lambda r, a: _compat.pbroadcast(r, (a,) if isinstance(a, str) else a, source))


def all_gather(x: Any, axis_name: Any, *, axis_index_groups: Any = None, axis: int = 0,
               tiled: bool = False, to: str = "varying") -> Any:
    """Typed `jax.lax.all_gather`.

    `to="varying"` (default): Varying -> Varying; `to="invarying"`: Varying -> Invariant;
    `to="reduced"`: Varying -> Reduced (the ZeRO/FSDP parameter gather: its gradient is
    Unreduced and is reduced with `psum_scatter`).
    """
    _no_groups(axis_index_groups, "st.all_gather")
    # check_vma=False: every value is Invariant to JAX; gather plainly (same data and program).
    def bind(r: Any, a: Any) -> Any:
        # the gathered dimension: an existing one when tiled, else one more (JAX inserts it)
        nd = _ndim(r)
        _validate.dim_arg(axis, None if nd is None else nd + (not tiled), "st.all_gather", "axis")
        return _compat.all_gather(r, a, axis=axis, tiled=tiled,
                                  to="varying" if in_vma_off() else to)

    return _axis_op("all_gather", x, axis_name, bind, to, params={"axis": axis, "tiled": tiled})


def psum_scatter(x: Any, axis_name: Any, *, scatter_dimension: int = 0,
                 axis_index_groups: Any = None, tiled: bool = False) -> Any:
    """Typed `jax.lax.psum_scatter`: Varying or Unreduced -> Varying (summed, scattered)."""
    _no_groups(axis_index_groups, "st.psum_scatter")
    def bind(r: Any, a: Any) -> Any:
        op = "st.psum_scatter"
        _validate.dim_arg(scatter_dimension, _ndim(r), op, "scatter_dimension")
        _validate.divisible(_shape(r), scatter_dimension, _compat.axis_size(a), op,
                            "scatter_dimension", a, tiled=bool(tiled))
        return _compat.psum_scatter(r, a, scatter_dimension=scatter_dimension, tiled=tiled)

    return _axis_op("psum_scatter", x, axis_name, bind,
                    params={"scatter_dimension": scatter_dimension, "tiled": tiled})


def all_to_all(x: Any, axis_name: Any, split_axis: int, concat_axis: int, *,
               axis_index_groups: Any = None, tiled: bool = False) -> Any:
    """Typed `jax.lax.all_to_all`: Varying -> Varying."""
    _no_groups(axis_index_groups, "st.all_to_all")
    def bind(r: Any, a: Any) -> Any:
        op = "st.all_to_all"
        _validate.dim_arg(split_axis, _ndim(r), op, "split_axis")
        _validate.dim_arg(concat_axis, _ndim(r), op, "concat_axis")
        _validate.divisible(_shape(r), split_axis, _compat.axis_size(a), op, "split_axis", a,
                            tiled=bool(tiled))
        return _compat.all_to_all(r, a, split_axis, concat_axis, tiled=tiled)

    return _axis_op("all_to_all", x, axis_name, bind,
                    params={"split_axis": split_axis, "concat_axis": concat_axis, "tiled": tiled})


def _ndim(r: Any) -> int | None:
    nd = getattr(r, "ndim", None)
    return nd if isinstance(nd, int) else None


def _shape(r: Any) -> tuple[int, ...] | None:
    shape = getattr(r, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else None


def _cast_bind(to: str) -> Callable[[Any, Any], Any]:
    def bind(r: Any, a: Any) -> Any:
        if in_vma_off():
            return r  # check_vma=False: JAX's casts are no-ops (and to='unreduced' raises)
        if to == "reduced" and (isinstance(r, (int, float)) or not hasattr(r, "dtype")):
            r = _compat.asarray_like(r, r)  # reference Q13: bare AssertionError on scalars
        return _compat.pcast(r, a, to=to)

    return bind


def pvary(x: Any, axis_name: Any) -> Any:
    """Invariant -> Varying on the named axes (a free cast: `jax.lax.pcast(to="varying")`)."""
    return _axis_op("pvary", x, axis_name, _cast_bind("varying"))


def pcast(x: Any, axis_name: Any, *, to: str) -> Any:
    """Typed `jax.lax.pcast`: the free casts I->V, R->V (`to="varying"`), I->R (`"reduced"`),
    V->U (`"unreduced"`). Python scalars are accepted (cast through `jnp.asarray`)."""
    return _axis_op("pcast", x, axis_name, _cast_bind(to), to)


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


#: every collective and cast of the surface table (`_surface.COLLECTIVE_NAMES`)
__all__ = sorted(_surface.COLLECTIVE_NAMES)  # noqa: PLE0605
_missing = [n for n in __all__ if n not in globals()]
assert not _missing, f"_collectives lacks surface-table collectives {_missing}"

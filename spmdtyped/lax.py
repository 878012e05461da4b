"""`spmdtyped.lax`: a drop-in for `jax.lax` whose collectives run spmdtyped's checks.

Porting step 1. Change one import in existing shard_map code,

```python
from jax import lax                  # before
import spmdtyped.lax as lax          # after
```

and every collective (`psum`, `pmean`, `pmax`, `pmin`, `ppermute`, `pshuffle`, `pbroadcast`,
`all_gather`, `psum_scatter`, `all_to_all`, `axis_index`, `axis_size`, `pcast`) checks the
manual-axis state of its raw input against the rule table before anything is bound, with
`jax.lax`'s names, signatures, keywords and pytree handling. Inputs and results are raw JAX
values, so nothing else in the program changes. Every other `jax.lax` name (`scan`, `dot_general`,
`fori_loop`, ...) is `jax.lax`'s own, forwarded by the module `__getattr__`.

The checks run only where JAX tracks manual-axis types: inside a `jax.shard_map` with
`check_vma=True`. Elsewhere (a `jax.vmap`/`pmap` axis, `check_vma=False`, no mesh) the call is
`jax.lax`'s, unchanged. A Python scalar argument (`lax.psum(1, "dp")`, the axis-size idiom) is
also passed to JAX unchecked: it is a constant, and JAX returns a Python number.
"""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import jax.lax as _jlax

from . import _compat, _rules, _surface
from ._errors import error
from ._errors.jax_messages import jax_errors
from ._ops import collectives as _collectives
from ._typed.array import is_typed, operand

#: the collectives of the surface table that `spmdtyped.lax` checks (`_surface.LAX_NAMES`)
__all__ = sorted(_surface.LAX_NAMES)  # noqa: PLE0605

#: the names this module checks; every other `jax.lax` attribute is forwarded unchanged
CHECKED = tuple(__all__)
# jax.lax's own functions, captured at import: `st.adapters.typed_shard_map` temporarily
# routes `jax.lax.<name>` through this module, and the unchecked paths must not loop back.
_J: Any = types.SimpleNamespace(**{n: getattr(_jlax, n) for n in CHECKED})


def _raw(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf.raw if is_typed(leaf) else leaf, tree,
                                  is_leaf=is_typed)


_STATE = threading.local()


@contextlib.contextmanager
def _inside() -> Iterator[None]:
    # while a checked call runs, nested calls (spmdtyped binding through a routed jax.lax)
    # are jax.lax's own
    # and JAX's manual-axis errors are raised as SpmdTypeErrors (JAX's chained)
    _STATE.depth = getattr(_STATE, "depth", 0) + 1
    try:
        with jax_errors("spmdtyped.lax"):
            yield
    finally:
        _STATE.depth -= 1


def _checking(x: Any = None) -> bool:
    """True inside a check_vma shard_map body, for an argument that is not only Python scalars."""
    if getattr(_STATE, "depth", 0):
        return False
    _, manual = _compat.current_mesh()
    if not manual or not _compat.check_vma_enabled():
        return False
    if x is not None:
        leaves = jax.tree_util.tree_leaves(x, is_leaf=is_typed)
        if leaves and all(isinstance(leaf, (int, float, complex)) for leaf in leaves):
            return False
    return True


def _tree_bind(rule: str, x: Any, axis_name: Any, bind: Any) -> Any:
    """A collective on a pytree of several leaves, bound as `jax.lax` binds it: every leaf is
    checked with the rule table first, then one `jax.lax` call takes the whole tree (JAX binds
    all leaves' psums before the divides of a pmean; per-leaf binding would lower differently)."""
    op = f"st.{rule}"
    axes = _rules.normalize_axes(axis_name, op)
    mesh_axes, manual = _compat.current_mesh()
    _rules.check_axes_known(axes, op, manual, mesh_axes)
    for leaf in jax.tree_util.tree_leaves(x, is_leaf=is_typed):
        _, t = operand(leaf)
        out_t = _rules.axis_op(rule, t if isinstance(t, _rules.SpmdType) else _rules.INVARIANT,
                               axes, _compat.FEATURES, op=op)
        if (out_t.unreduced or out_t.reduced) and len(manual) < len(mesh_axes):
            raise error("SPMD403", f"{op}: Unreduced/Reduced values need a full-manual "
                        f"shard_map, but only {list(manual)} of {list(mesh_axes)} are manual",
                        op=op, fix="make every mesh axis manual, or keep the value Varying")
    return bind(_raw(x))


def _many(x: Any, axis_index_groups: Any) -> bool:
    return axis_index_groups is None and len(jax.tree_util.tree_leaves(x, is_leaf=is_typed)) > 1


def _reduce(name: str, x: Any, axis_name: Any, axis_index_groups: Any) -> Any:
    """`jax.lax.<name>` (psum, pmean, pmax, pmin), checked through `_collectives.<name>`; a
    pytree of several leaves as one bind (`_tree_bind`)."""
    jfn = getattr(_J, name)
    if not _checking(x):
        return jfn(x, axis_name, axis_index_groups=axis_index_groups)
    with _inside():
        if _many(x, axis_index_groups):
            return _tree_bind(name, x, axis_name, lambda r: jfn(r, axis_name))
        return _raw(getattr(_collectives, name)(x, axis_name,
                                                axis_index_groups=axis_index_groups))


def psum(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """`jax.lax.psum`, checked: the input must be Varying or Unreduced on `axis_name`.

    **Arguments:** as `jax.lax.psum`; `x` is an array or a pytree of arrays.

    **Returns:** what `jax.lax.psum` returns (raw JAX values).

    **Raises:** `spmdtyped.AxisStateError`: SPMD101 (Reduced input), SPMD103 (already
    Invariant: JAX would multiply by the axis size, e.g. a double psum), SPMD104 (mixed
    states over a tuple of axes); `spmdtyped.UsageError` for unknown axes (SPMD501).

    !!! Example
        ```python
        import spmdtyped.lax as lax
        y = lax.psum(x @ w, "tp")      # as jax.lax.psum, plus the state check
        ```
    """
    return _reduce("psum", x, axis_name, axis_index_groups)


def pmean(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """`jax.lax.pmean`, checked like `psum` (a pmean of already-summed gradients is SPMD103)."""
    return _reduce("pmean", x, axis_name, axis_index_groups)


def pmax(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """`jax.lax.pmax`, checked: Varying (or, on jax 0.12, Unreduced of kind max) input."""
    return _reduce("pmax", x, axis_name, axis_index_groups)


def pmin(x: Any, axis_name: Any, *, axis_index_groups: Any = None) -> Any:
    """`jax.lax.pmin`, checked: Varying (or, on jax 0.12, Unreduced of kind min) input."""
    return _reduce("pmin", x, axis_name, axis_index_groups)


def ppermute(x: Any, axis_name: Any, perm: Sequence[tuple[int, int]]) -> Any:
    """`jax.lax.ppermute`, checked: the input must be Varying on `axis_name`.

    A replicated (Invariant) input is SPMD103: JAX would pvary it and send identical copies.
    """
    if not _checking(x):
        return _J.ppermute(x, axis_name, perm)
    with _inside():
        if _many(x, None):
            return _tree_bind("ppermute", x, axis_name, lambda r: _J.ppermute(r, axis_name, perm))
        return _raw(_collectives.ppermute(x, axis_name, perm))


def pshuffle(x: Any, axis_name: Any, perm: Sequence[int]) -> Any:
    """`jax.lax.pshuffle`, checked like `ppermute`."""
    if not _checking(x):
        return _J.pshuffle(x, axis_name, perm)
    with _inside():
        return _raw(_collectives.pshuffle(x, axis_name, perm))


def pbroadcast(x: Any, axis_name: Any, source: Any) -> Any:
    """`jax.lax.pbroadcast`, checked: the input must be Varying on `axis_name`."""
    if not _checking(x):
        return _J.pbroadcast(x, axis_name, source)
    with _inside():
        return _raw(_collectives.pbroadcast(x, axis_name, source))


def all_gather(x: Any, axis_name: Any, *, axis_index_groups: Any = None, axis: int = 0,
               tiled: bool = False, to: str = "varying") -> Any:
    """`jax.lax.all_gather`, checked: the input must be Varying on `axis_name`.

    **Arguments:** as `jax.lax.all_gather` (`to="varying"|"invarying"|"reduced"`).

    **Returns:** the gathered raw array(s).

    **Raises:** `spmdtyped.AxisStateError` SPMD101/102/103 for a Reduced, Unreduced or
    Invariant input on `axis_name`.
    """
    if not _checking(x):
        return _J.all_gather(x, axis_name, axis_index_groups=axis_index_groups, axis=axis,
                                tiled=tiled, to=to)
    with _inside():
        return _raw(_collectives.all_gather(x, axis_name, axis_index_groups=axis_index_groups,
                                        axis=axis, tiled=tiled, to=to))


def psum_scatter(x: Any, axis_name: Any, *, scatter_dimension: int = 0,
                 axis_index_groups: Any = None, tiled: bool = False) -> Any:
    """`jax.lax.psum_scatter`, checked: Varying or Unreduced input on `axis_name`."""
    if not _checking(x):
        return _J.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension,
                                  axis_index_groups=axis_index_groups, tiled=tiled)
    with _inside():
        return _raw(_collectives.psum_scatter(x, axis_name, scatter_dimension=scatter_dimension,
                                          axis_index_groups=axis_index_groups, tiled=tiled))


def all_to_all(x: Any, axis_name: Any, split_axis: int, concat_axis: int, *,
               axis_index_groups: Any = None, tiled: bool = False) -> Any:
    """`jax.lax.all_to_all`, checked: the input must be Varying on `axis_name`."""
    if not _checking(x):
        return _J.all_to_all(x, axis_name, split_axis, concat_axis,
                                axis_index_groups=axis_index_groups, tiled=tiled)
    with _inside():
        return _raw(_collectives.all_to_all(x, axis_name, split_axis, concat_axis,
                                        axis_index_groups=axis_index_groups, tiled=tiled))


def pcast(x: Any, axis_name: Any, *, to: str) -> Any:
    """`jax.lax.pcast`, checked: I->V or R->V (`to="varying"`), I->R (`"reduced"`), V->U
    (`"unreduced"`); anything else is SPMD301 instead of JAX's `Unsupported pcast`."""
    if not _checking():
        return _J.pcast(x, axis_name, to=to)
    with _inside():
        return _raw(_collectives.pcast(x, axis_name, to=to))


def axis_index(axis_name: Any) -> Any:
    """`jax.lax.axis_index`, with the axis names checked against the mesh (SPMD501)."""
    if not _checking():
        return _J.axis_index(axis_name)
    with _inside():
        return _raw(_collectives.axis_index(axis_name))


def axis_size(axis_name: Any) -> int:
    """`jax.lax.axis_size`, with the axis names checked against the mesh (SPMD501)."""
    if not _checking():
        return int(_J.axis_size(axis_name))
    with _inside():
        return _collectives.axis_size(axis_name)


_missing = [n for n in __all__ if n not in globals()]
assert not _missing, f"spmdtyped.lax lacks surface-table collectives {_missing}"


def __getattr__(name: str) -> Any:
    # every other jax.lax name (scan, fori_loop, dot_general, ...) is jax.lax's own; dunders
    # (__path__, __wrapped__, ...) are not forwarded: this module is not jax.lax's package
    if name.startswith("__"):
        raise AttributeError(f"module 'spmdtyped.lax' has no attribute {name!r}")
    return getattr(_jlax, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_jlax)))

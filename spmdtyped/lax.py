"""`spmdtyped.lax`: a drop-in for `jax.lax` whose collectives run spmdtyped's checks.

Porting step 1. Change one import in existing shard_map code,

```python
from jax import lax                  # before
import spmdtyped.lax as lax          # after
```

and every collective (`psum`, `pmean`, `pmax`, `pmin`, `ppermute`, `pshuffle`, `pbroadcast`,
`all_gather`, `psum_scatter`, `all_to_all`, `axis_index`, `axis_size`, `pcast`: each made from
its row of the collective table, `_surface.collectives`, with JAX's signature) checks the
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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import jax
import jax.lax as _jlax

from . import _compat, _rules, _surface
from ._errors import error
from ._errors.jax_messages import jax_errors
from ._ops import collectives as _collectives
from ._typed.array import is_typed, operand

if TYPE_CHECKING:
    from ._static import AxisName

#: the collectives of the surface table that `spmdtyped.lax` checks (`_surface.LAX_NAMES`)
__all__ = sorted(_surface.LAX_NAMES)  # noqa: PLE0605

#: the names this module checks; every other `jax.lax` attribute is forwarded unchanged
CHECKED = tuple(__all__)
# jax.lax's own functions are `_compat.resolve`'s (captured at import):
# `st.adapters.typed_shard_map` temporarily routes `jax.lax.<name>` through this module, and
# the unchecked paths must not loop back.


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


def _tree_bind(rule: str, x: Any, axis_name: Any, bind: Any, label: str | None = None) -> Any:
    """A collective on a pytree of several leaves, bound as `jax.lax` binds it: every leaf is
    checked with the rule table first, then one `jax.lax` call takes the whole tree (JAX binds
    all leaves' psums before the divides of a pmean; per-leaf binding would lower differently)."""
    op = label or f"st.{rule}"
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


def call(name: str, x: Any, axis_name: Any, args: dict[str, Any]) -> Any:
    """`spmdtyped.lax.<name>(x, axis_name, **args)` by its row of the collective table:
    `jax.lax`'s own call outside a checked shard_map body (and for Python scalars, except to
    the casts); else `st.<name>` on the value, unwrapped, or, for a pytree of several leaves
    of a `tree_bind` row, every leaf checked and one `jax.lax` call (`_tree_bind`)."""
    c = _surface.collective(name)
    assert c is not None and c.ops, name
    jfn = _compat.resolve(c.jax)
    positional = [args[p.name] for p in c.params if not p.keyword]
    keywords = {p.name: args[p.name] for p in c.params if p.keyword}
    casts = all(_rules.AXIS_OPS[op].is_cast for op in c.ops)
    if not _checking(None if casts else x):
        return jfn(x, axis_name, *positional, **keywords, **c.fixed)
    with _inside():
        if c.tree_bind and c.select is None and _many(x, args.get("axis_index_groups")):
            return _tree_bind(c.op(), x, axis_name,
                              lambda r: jfn(r, axis_name, *positional, **keywords, **c.fixed),
                              label=f"st.{name}")
        return _raw(getattr(_collectives, name)(x, axis_name, **args))


def _axis(name: str, axis_name: Any) -> Any:
    """`axis_index` / `axis_size`: the axis names checked against the mesh (SPMD501)."""
    if not _checking():
        return _compat.resolve(f"jax.lax.{name}")(axis_name)
    with _inside():
        return _raw(getattr(_collectives, name)(axis_name))


def _make(c: _surface.Collective) -> Any:
    doc = (f"`{c.jax}`, checked: spmdtyped's rules run on the manual-axis states of the raw "
           f"input before anything is bound; takes and returns raw JAX values.\n\n{c.doc}")
    if not c.ops:
        return _collectives.make(c, module=__name__, body="_axis({name!r}, axis_name)",
                                 scope={"_axis": _axis}, doc=doc)
    return _collectives.make(c, module=__name__, scope={"call": call}, doc=doc)


#: the drop-ins made from the built-in rows; a row registered later is made on first use
_MADE: dict[str, tuple[_surface.Collective, Any]] = {}
if TYPE_CHECKING:
    # what type checkers see (they cannot run the loop below): the rows' signatures, raw
    # values in and out; `tests/test_collective_row.py` checks them against the rows
    def psum(x: Any, axis_name: AxisName, *, axis_index_groups: Any = None) -> Any: ...
    def pmean(x: Any, axis_name: AxisName, *, axis_index_groups: Any = None) -> Any: ...
    def pmax(x: Any, axis_name: AxisName, *, axis_index_groups: Any = None) -> Any: ...
    def pmin(x: Any, axis_name: AxisName, *, axis_index_groups: Any = None) -> Any: ...
    def ppermute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> Any: ...
    def pshuffle(x: Any, axis_name: AxisName, perm: Sequence[int]) -> Any: ...
    def pbroadcast(x: Any, axis_name: AxisName, source: int) -> Any: ...
    def all_gather(x: Any, axis_name: AxisName, *, axis_index_groups: Any = None, axis: int = 0,
                   tiled: bool = False, to: str = "varying") -> Any: ...
    def psum_scatter(x: Any, axis_name: AxisName, *, scatter_dimension: int = 0,
                     axis_index_groups: Any = None, tiled: bool = False) -> Any: ...
    def all_to_all(x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, *,
                   axis_index_groups: Any = None, tiled: bool = False) -> Any: ...
    def pcast(x: Any, axis_name: AxisName, *, to: str) -> Any: ...
    def axis_index(axis_name: AxisName) -> Any: ...
    def axis_size(axis_name: AxisName) -> int: ...
else:
    for _c in _surface.COLLECTIVES:
        if _c.in_lax:
            globals()[_c.name] = _make(_c)

_missing = [n for n in __all__ if n not in globals()]
assert not _missing, f"spmdtyped.lax lacks surface-table collectives {_missing}"


def __getattr__(name: str) -> Any:
    c = _surface.collective(name)
    if c is not None and c.in_lax:  # a row registered after import
        made = _MADE.get(name)
        if made is None or made[0] is not c:
            made = _MADE[name] = (c, _make(c))
        return made[1]
    # every other jax.lax name (scan, fori_loop, dot_general, ...) is jax.lax's own; dunders
    # (__path__, __wrapped__, ...) are not forwarded: this module is not jax.lax's package
    if name.startswith("__"):
        raise AttributeError(f"module 'spmdtyped.lax' has no attribute {name!r}")
    return getattr(_jlax, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(dir(_jlax)))

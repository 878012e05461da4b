"""Axis names: JAX's accepted spellings (SPMD502) and the names a mesh knows (SPMD501/503)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from .._errors import error


def normalize_axes(axis_name: object, op: str) -> tuple[str, ...]:
    """JAX's accepted spellings of axis names -> a tuple; sets, lists, repeats are SPMD502."""
    if isinstance(axis_name, str):
        return (axis_name,)
    if isinstance(axis_name, tuple) and all(isinstance(a, str) for a in axis_name):
        if len(set(axis_name)) != len(axis_name):
            dup = sorted({a for a in axis_name if axis_name.count(a) > 1})
            raise error("SPMD502", f"{op}: axis names repeat {dup} in {axis_name!r}", op=op,
                        fix=f"{op}(x, {tuple(dict.fromkeys(axis_name))!r})")
        return axis_name
    if isinstance(axis_name, (set, frozenset)):
        names = tuple(sorted(a for a in axis_name if isinstance(a, str)))
        raise error("SPMD502", f"{op}: axis names given as a set {axis_name!r}; the order of "
                    f"axes matters, pass a tuple", op=op, fix=f"{op}(x, {names!r})")
    if isinstance(axis_name, list):
        raise error("SPMD502", f"{op}: axis names given as a list {axis_name!r}; pass a tuple",
                    op=op, fix=f"{op}(x, {tuple(axis_name)!r})")
    raise error("SPMD502", f"{op}: axis_name must be a str or a tuple of str, got "
                f"{type(axis_name).__name__} {axis_name!r}", op=op)


def check_axes_known(
    axes: Iterable[str], op: str, manual: Iterable[str], mesh_axes: Iterable[str] | None = None
) -> None:
    """SPMD501 for a name not in the mesh (closest suggested), SPMD503 for a non-manual axis."""
    manual = tuple(manual)
    mesh = tuple(mesh_axes) if mesh_axes is not None else manual
    for a in axes:
        if a in manual:
            continue
        if a in mesh:
            raise error("SPMD503", f"{op}: axis {a!r} is not manual in this shard_map (manual "
                        f"axes: {list(manual)})", axes=(a,), op=op,
                        fix=f"st.shard_map(..., axis_names={set(manual) | {a}!r})")
        close = difflib.get_close_matches(a, mesh, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise error("SPMD501", f"{op}: {a!r} is not an axis of the mesh (axes: {list(mesh)}){hint}",
                    axes=(a,), op=op,
                    fix=f"{op}(x, {close[0]!r})" if close else None)


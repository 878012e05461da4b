"""Argument checks of the public functions (issue 26): each raises `UsageError` SPMD509
naming the API, the argument, what it got and what it expects, before the argument is used
(so no AttributeError / IndexError / TypeError from inside spmdtyped or JAX reaches the user).

Checks of axis names live in `_rules.axes` (SPMD501/502); these are the other arguments:
callables, meshes, `axis_names=`, specs, argnums, permutations and array dimensions.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental.hijax import HiPspec
from jax.sharding import PartitionSpec

from ._errors import SpmdTypeError, error, raised_as
from ._errors import jax_messages as _jax_errors


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def bad(op: str, arg: str, value: Any, expects: str, fix: str) -> Exception:
    """The SPMD509 error of argument `arg` of `op` (built, not raised)."""
    return error("SPMD509", f"{op}: {arg} must be {expects}, got {_got(value)}", op=op, fix=fix)


def callable_arg(f: Any, op: str, arg: str = "the function") -> None:
    if not callable(f):
        raise bad(op, arg, f, "a callable", f"{op}(fn, ...) with fn a function, e.g. lambda x: x")


def mesh_arg(mesh: Any, op: str) -> None:
    """A `jax.sharding.Mesh` or `AbstractMesh` (a mesh axis name or a device list is not)."""
    if isinstance(mesh, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
        return
    raise bad(op, "mesh", mesh, "a jax.sharding.Mesh (or AbstractMesh)",
              'mesh=jax.make_mesh((2, 4), ("dp", "tp"))')


def axis_names_arg(axis_names: Any, op: str) -> frozenset[str]:
    """`axis_names=`: a set of mesh axis names (a str, tuple or list is accepted as JAX does)."""
    if isinstance(axis_names, str):
        return frozenset({axis_names})
    if isinstance(axis_names, (set, frozenset, tuple, list)) \
            and all(isinstance(a, str) for a in axis_names):
        return frozenset(axis_names)
    raise bad(op, "axis_names", axis_names, "a set of mesh axis names (str)",
              'axis_names={"dp"}')


def spec_tree(specs: Any, op: str, what: str, *, hijax: bool = False) -> None:
    """Every leaf of an in_specs / out_specs pytree is a PartitionSpec or None, and each entry
    of a PartitionSpec is None, an axis name or a tuple of axis names. `hijax`: a hijax type's
    spec (`jax.experimental.hijax.HiPspec`) is a leaf too, JAX's to check (the drop-in)."""
    leaves = jax.tree_util.tree_leaves(
        specs, is_leaf=lambda s: s is None or isinstance(s, PartitionSpec))
    for spec in leaves:
        if spec is None or (hijax and isinstance(spec, HiPspec)):
            continue
        if isinstance(spec, HiPspec):
            raise bad(op, what, spec, "a PartitionSpec (or a pytree of them): a hijax type's "
                      "spec is taken by `st.adapters.typed_shard_map`, which leaves hijax "
                      "values to JAX's checks", f'{what}=P("dp")')
        if not isinstance(spec, PartitionSpec):
            raise bad(op, what, spec, "a PartitionSpec (or a pytree of them)",
                      f'{what}=P("dp") or {what}=(P("dp"), P())')
        entries = spec.partitions if hasattr(spec, "partitions") else tuple(spec)
        for entry in entries:
            ok = entry is None or isinstance(entry, str) or entry is PartitionSpec.UNCONSTRAINED \
                or (isinstance(entry, tuple) and all(isinstance(a, str) for a in entry))
            if not ok:
                raise bad(op, f"{what} entry of {spec!r}", entry,
                          "None, a mesh axis name or a tuple of them (one per dimension)",
                          f'{what}=P("dp", None)')


def _index(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def argnums_arg(argnums: Any, nargs: int, op: str) -> tuple[int, ...]:
    """`argnums=`: an int or a sequence of ints, each naming one of the `nargs` positional
    arguments of the call (negative counts from the end, as in JAX)."""
    nums = (argnums,) if _index(argnums) is not None else argnums
    if not isinstance(nums, (tuple, list)) or not nums or any(_index(k) is None for k in nums):
        raise bad(op, "argnums", argnums, "an int or a non-empty tuple of ints", "argnums=0")
    for k in nums:
        if not -nargs <= k < nargs:
            raise bad(op, "argnums", argnums,
                      f"positions of the {nargs} positional argument(s) of the call "
                      f"(0..{nargs - 1})", f"argnums={max(nargs - 1, 0)}")
    return tuple(k % nargs for k in nums)


def perm_arg(perm: Any, size: int, op: str, axis: Any) -> None:
    """`ppermute`'s `perm`: (source, destination) pairs of device indices along the axis,
    sources distinct and destinations distinct."""
    pairs: list[tuple[int, int]] = []
    ok = isinstance(perm, Sequence) and not isinstance(perm, str)
    for p in perm if ok else ():
        if not (isinstance(p, Sequence) and len(p) == 2 and all(_index(i) is not None for i in p)):
            ok = False
            break
        pairs.append((int(p[0]), int(p[1])))
    expects = f"a list of (source, destination) pairs of indices 0..{size - 1} along {axis!r}"
    fix = f"perm=[(i, (i + 1) % {size}) for i in range({size})]"
    if not ok:
        raise bad(op, "perm", perm, expects, fix)
    if any(not (0 <= i < size and 0 <= j < size) for i, j in pairs):
        raise bad(op, "perm", perm, expects + f" (the axis has {size} devices)", fix)
    if len({i for i, _ in pairs}) < len(pairs) or len({j for _, j in pairs}) < len(pairs):
        raise bad(op, "perm", perm, expects + ", each source and each destination once", fix)


def shuffle_arg(perm: Any, size: int, op: str, axis: Any) -> None:
    """`pshuffle`'s `perm`: a permutation of 0..size-1."""
    ok = isinstance(perm, Sequence) and not isinstance(perm, str) \
        and all(_index(i) is not None for i in perm)
    if not ok or sorted(int(i) for i in perm) != list(range(size)):
        raise bad(op, "perm", perm, f"a permutation of 0..{size - 1} (the devices along {axis!r})",
                  f"perm=[(i + 1) % {size} for i in range({size})]")


def dim_arg(d: Any, ndim: int | None, op: str, arg: str) -> None:
    """An array dimension (`split_axis`, `scatter_dimension`, `axis`) of a rank-`ndim` value."""
    i = _index(d)
    if i is None:
        raise bad(op, arg, d, "an int (a dimension of the operand)", f"{arg}=0")
    if ndim is not None and not -ndim <= i < ndim:
        raise bad(op, arg, d, f"a dimension of the rank-{ndim} operand "
                  f"({-ndim}..{ndim - 1})", f"{arg}=0")


def divisible(shape: Sequence[int] | None, dim: int, size: int, op: str, arg: str,
              axis: Any, *, tiled: bool = True) -> None:
    """A dimension split over an axis of `size` devices has a multiple of `size` elements
    (`tiled=False`: exactly `size`, one per device)."""
    if shape is None or not shape:
        return
    n = shape[dim]
    if isinstance(n, int) and not tiled and n != size:
        raise error("SPMD509", f"{op}: dimension {arg}={dim} of the operand has {n} elements; "
                    f"without tiled=True it must have one per device along {axis!r} ({size})",
                    op=op, fix=f"{op}(..., tiled=True), or a dimension of size {size}")
    if isinstance(n, int) and n % size:
        raise error("SPMD509", f"{op}: dimension {arg}={dim} of the operand has {n} elements, "
                    f"which {size} devices along {axis!r} cannot split evenly", op=op,
                    fix=f"pad dimension {dim} to a multiple of {size}, or split another one")


def branches_arg(branches: Any, op: str) -> None:
    """`switch`'s `branches`: a non-empty sequence of callables."""
    if not isinstance(branches, Sequence) or isinstance(branches, str) or not branches:
        raise bad(op, "branches", branches, "a non-empty list of functions",
                  f"{op}(index, [f0, f1], x)")
    for k, b in enumerate(branches):
        callable_arg(b, op, f"branches[{k}]")


def not_an_array(x: Any, op: str | None = None) -> Exception:
    """SPMD509 for an array operand that is no JAX value (None, a str, a list)."""
    where = f"{op}: " if op else ""
    return error("SPMD509", f"{where}an array operand must be a JAX array, a typed value or a "
                 f"Python number, got {_got(x)}", op=op, fix="jnp.asarray(value)")


def int_arg(v: Any, op: str, arg: str) -> None:
    """A loop bound or branch index: an int, or an integer array (traced or typed)."""
    dtype = getattr(getattr(v, "raw", v), "dtype", None)
    if _index(v) is not None and not isinstance(v, bool) or \
            (dtype is not None and np.issubdtype(dtype, np.integer)):
        return
    raise bad(op, arg, v, "an int or an integer scalar array", f"{arg}=0")


def pred_arg(p: Any, op: str) -> None:
    """`cond`'s predicate: a bool, or a boolean / integer scalar array (traced or typed)."""
    if isinstance(p, (bool, int, np.bool_, np.integer)) or \
            getattr(getattr(p, "raw", p), "dtype", None) is not None:
        return
    raise bad(op, "pred", p, "a bool or a boolean scalar array", f"{op}(x.sum() > 0, f, g, x)")


def shard_map_args(f: Any, mesh: Any, in_specs: Any, out_specs: Any, axis_names: Any,
                   op: str, *, infer: Any, hijax: bool = False) -> frozenset[str]:
    """The arguments of `st.shard_map`, `adapters.typed_shard_map` and `adapters.infer`
    (`f` None: the decorator form; `in_specs is infer`: JAX's Infer): the function, the mesh,
    the specs (`hijax`: hijax types' specs taken, `spec_tree`) and `axis_names` (returned as a
    set)."""
    if f is not None:
        callable_arg(f, op)
    if mesh is not None:
        mesh_arg(mesh, op)
    names = axis_names_arg(axis_names, op)
    if in_specs is not infer:
        spec_tree(in_specs, op, "in_specs", hijax=hijax)
    spec_tree(out_specs, op, "out_specs", hijax=hijax)
    return names


def given_specs(out_specs: Any, op: str) -> None:
    """`out_specs` of an API that cannot derive them (the adapters: a raw function has no
    hints): not None."""
    if out_specs is None:
        raise bad(op, "out_specs", out_specs, "a PartitionSpec or a pytree of them (a raw "
                  "function's out_specs cannot be derived from hints)", "out_specs=P()")


@contextlib.contextmanager
def jax_arguments(op: str) -> Iterator[None]:
    """SPMD509 for the arguments a `jax.numpy` / `jax.nn` function rejects (an axis out of
    range, a float shape, a bad pad width), with the message and its exception chained; JAX's
    manual-axis errors keep their own codes (`_jax_errors.translate`)."""
    try:
        yield
    except SpmdTypeError:
        raise
    except (TypeError, ValueError, IndexError, AssertionError) as e:
        translated = _jax_errors.translate(e)
        if translated is not None:
            raise raised_as(translated, e) from e
        first = (str(e).splitlines() or [""])[0][:200] or type(e).__name__
        raise raised_as(error(
            "SPMD509", f"{op}: the arguments were rejected ({type(e).__name__}: {first})",
            op=op, fix=f"pass {op} the arguments jax.numpy takes (jax.numpy's documentation of "
            f"{op.rsplit('.', 1)[-1]})"), e) from e

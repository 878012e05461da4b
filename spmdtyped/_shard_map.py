"""Typed `shard_map`: specs -> input states; outputs checked against out_specs before JAX's check."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.sharding import PartitionSpec

from . import _compat, _rules
from ._array import is_typed, typeof, unwrap, vma_off, with_refinement, wrap
from ._errors import SpmdTypeError, error, error_context
from ._rules import refine_shape


def is_spec_leaf(s: Any) -> bool:
    """A leaf of an in_specs/out_specs pytree: a PartitionSpec or None."""
    return s is None or isinstance(s, PartitionSpec)


def _broadcast_prefix(specs: Any, tree: Any, what: str, where: str) -> list[tuple[Any, Any]]:
    """Pair each spec with each leaf of `tree` under it (specs is a pytree prefix of tree)."""
    pairs: list[tuple[Any, Any]] = []
    try:
        jax.tree_util.tree_map(
            lambda spec, sub: pairs.extend(
                (spec, leaf) for leaf in jax.tree_util.tree_leaves(sub, is_leaf=is_typed)),
            specs, tree, is_leaf=is_spec_leaf)
    except (ValueError, TypeError) as e:
        s_def = jax.tree_util.tree_structure(specs, is_leaf=is_spec_leaf)
        t_def = jax.tree_util.tree_structure(tree, is_leaf=is_typed)
        raise error("SPMD402", f"{where}: {what} do not match the structure of the "
                    f"{'arguments' if what == 'in_specs' else 'outputs'}", op="st.shard_map",
                    details=(f"{what}: {s_def}", f"values: {t_def}", f"jax: {str(e).splitlines()[0]}"),
                    fix=f"give one PartitionSpec per {'argument' if what == 'in_specs' else 'output'}") from None
    return pairs


def shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Any, in_specs: Any = None,
              mesh: Any, axis_names: Any = frozenset(), check_vma: bool = True) -> Any:
    """Typed `jax.shard_map`: `f` receives typed values, returns typed (or raw) values.

    Same signature and semantics as `jax.shard_map` (decorator form too). Inputs are typed
    from `in_specs`: `P("dp")` gives `Varying["dp"]`, `P(reduced={"tp"})` gives
    `Reduced["tp"]`, `P(unreduced={"tp"})` gives `Unreduced["tp"]`. Outputs are checked
    against `out_specs` with an SPMD error (SPMD401) before JAX's own check. The result is raw
    JAX arrays; the compiled program is the one `jax.shard_map` builds.

    **Raises:** `BoundaryError` (SPMD401/402/403), `UsageError` (SPMD501 unknown axis in a spec).

    !!! Example
        ```python
        @st.shard_map(mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))
        def layer(x: st.Varying["dp"], w: st.Varying["tp"]) -> st.Varying["dp"]:
            return st.psum(x @ w, "tp")
        ```
    """
    if f is None:
        return functools.partial(shard_map, out_specs=out_specs, in_specs=in_specs, mesh=mesh,
                                 axis_names=axis_names, check_vma=check_vma)
    mesh_axes = _compat.mesh_axis_names(mesh)
    if isinstance(axis_names, (str, tuple, list)) and not isinstance(axis_names, (set, frozenset)):
        axis_names = {axis_names} if isinstance(axis_names, str) else set(axis_names)
    manual = tuple(a for a in mesh_axes if not axis_names or a in axis_names)
    _rules.check_axes_known(tuple(axis_names), "st.shard_map(axis_names=...)", mesh_axes)
    name = getattr(f, "__name__", repr(f))
    where = f"st.shard_map({name})"
    check_spec_axes(in_specs, mesh_axes, where, "in_specs")
    check_spec_axes(out_specs, mesh_axes, where, "out_specs")
    for spec in jax.tree_util.tree_leaves(in_specs, is_leaf=is_spec_leaf):
        if isinstance(spec, PartitionSpec):
            _, un, red, _ = _compat.spec_parts(spec)
            _rules.check_full_manual(un, red, manual, mesh_axes, where=where,
                                     spec=_rules.spec_text(spec))

    def spec_type(spec: Any) -> _rules.SpmdType:
        part, un, red, kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
        return _rules.in_spec_type(part, un, red, manual, kind)

    def typed_input(spec: Any, raw: Any, t: _rules.SpmdType | None) -> Any:
        # the state JAX gives the argument (or the spec's, check_vma=False), refined by the
        # spec: a dim named in it is a Shard of the global array; every input carries data
        x = wrap(raw, t)
        entries = _compat.spec_entries(spec if spec is not None else PartitionSpec())
        return with_refinement(x, refine_shape.from_spec(entries, len(raw.shape), manual))

    def body(*raw_args: Any) -> Any:
        specs = in_specs if in_specs is not None else PartitionSpec()
        if is_spec_leaf(specs):
            specs = tuple(specs for _ in raw_args)
        if check_vma:
            # the state JAX gives each argument (equal to spec_type(spec): JAX is the truth)
            args = jax.tree_util.tree_map(
                lambda spec, sub: jax.tree_util.tree_map(lambda r: typed_input(spec, r, None), sub),
                specs, tuple(raw_args), is_leaf=is_spec_leaf)
            out = f(*args)
        else:
            # check_vma=False: JAX types everything Invariant; spmdtyped tracks the states from
            # the specs itself, and still checks collectives and outputs.
            args = jax.tree_util.tree_map(
                lambda spec, sub: jax.tree_util.tree_map(
                    lambda r: typed_input(spec, r, spec_type(spec)), sub),
                specs, tuple(raw_args), is_leaf=is_spec_leaf)
            with vma_off():
                out = f(*args)
        check_outputs(out, out_specs, manual, where)
        return unwrap(out)

    smapped = _compat.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                axis_names=axis_names, check_vma=check_vma)

    @functools.wraps(f)
    @error_context(function=name, mesh=mesh, manual=manual)
    def wrapped(*args: Any) -> Any:
        check_in_structure(in_specs, args, where, "st.shard_map")
        raw_args = unwrap(list(args))
        with in_spec_errors(where, "st.shard_map"):
            return smapped(*raw_args)

    wrapped.__wrapped_shard_map__ = smapped  # type: ignore[attr-defined]
    return wrapped


@contextlib.contextmanager
def in_spec_errors(where: str, op: str) -> Iterator[None]:
    """JAX's own rejection of an in_spec (e.g. an argument not sharded as its spec says) as
    SPMD403, with the original chained; every other error passes through."""
    try:
        yield
    except SpmdTypeError:
        raise
    except ValueError as e:
        first = str(e).split("\n")[0]
        if "in_specs" in first:
            raise error("SPMD403", f"{where}: JAX rejected in_specs: {first}", op=op,
                        fix="shard the argument to match its spec (jax.device_put with "
                            "NamedSharding(mesh, spec)), or use an Explicit mesh for "
                            "reduced/unreduced specs") from e
        raise


def check_in_structure(in_specs: Any, args: tuple[Any, ...], where: str, op: str) -> None:
    """SPMD402 unless `in_specs` is a pytree prefix of the positional arguments."""
    if in_specs is None or is_spec_leaf(in_specs):
        return
    if isinstance(in_specs, tuple) and len(in_specs) != len(args):
        raise error("SPMD402", f"{where}: in_specs has {len(in_specs)} entries for {len(args)} "
                    f"arguments", op=op, fix="give one PartitionSpec per positional argument")
    _broadcast_prefix(in_specs, tuple(args), "in_specs", where)


def check_outputs(out: Any, out_specs: Any, manual: tuple[str, ...], where: str,
                  types: list[_rules.SpmdType] | None = None) -> None:
    """SPMD401 unless each output leaf's state fits its out_spec (`types`: given, or read from
    the values: typed values carry theirs, raw ones are read from JAX)."""
    for i, (spec, leaf) in enumerate(_broadcast_prefix(out_specs, out, "out_specs", where)):
        part, un, red, _kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
        t = types[i] if types is not None else typeof(leaf)
        _rules.check_out_spec(t, part, un, red, manual, where=where, spec=_rules.spec_text(spec))


def check_spec_axes(specs: Any, mesh_axes: tuple[str, ...], where: str, what: str) -> None:
    for spec in jax.tree_util.tree_leaves(specs, is_leaf=is_spec_leaf):
        if isinstance(spec, PartitionSpec):
            part, un, red, _ = _compat.spec_parts(spec)
            _rules.check_axes_known(tuple(part) + tuple(sorted(un)) + tuple(sorted(red)),
                                    f"{where} {what}", mesh_axes)

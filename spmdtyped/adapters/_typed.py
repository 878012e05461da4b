"""`typed_shard_map`: run an existing raw per-shard function with spmdtyped's checks.

Design (one trace for programs JAX accepts):

1. **The engine** (`_engine.check.check_shard_map`, the function `infer` and `st.shard_map`
   call): the program is `jax.shard_map(f)` itself. Its shard_map equation (the one JAX staged
   into the caller's trace, or, called eagerly, the one `jax.make_jaxpr` builds once per input
   signature before the program runs) is walked with the four states, Shard / Partial / Rep
   and the outputs against `out_specs`, which finds what JAX accepts and computes wrongly (a
   double psum behind JAX's auto-pvary, a bias added before the psum of a row-parallel
   projection, a cond on a varying predicate, ...). The first violation in program order is
   raised, at the user's line.
2. **Programs JAX rejects**: JAX's error is translated (`_jax_errors`), and the program is
   traced again with the outputs checked against `out_specs` (`run_infer`, as `infer` does),
   so the error names spmdtyped's code at the user's line instead of JAX's exception
   (chained).

Inputs are checked against `in_specs` (structure SPMD402, unknown axes SPMD501, JAX's
sharding mismatch as SPMD403). The executed program is `jax.shard_map(f)`'s.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .. import _compat, _validate
from .._boundary.shard_map import (
    check_in_structure,
    check_mesh_specs,
    errors_at_the_call,
    in_spec_errors,
    rejects_in_specs,
)
from .._engine.check import check_shard_map, check_staged, over_arrays, run_checked
from .._engine.walk import function_source, located, raised_at
from .._errors import SpmdTypeError, error, error_context, raised_as
from .._errors.jax_messages import jax_errors, translate
from ._conventions import (
    fn_name,
    manual_axes,
    named_like,
    raw_outputs,
    resolve_in_specs,
    resolve_mesh,
    signature_key,
)
from ._infer import CheckVmaWarning, run_infer, unknown_axis
from ._tracebacks import ShardMapCall, shard_map_call, traceback_mesh


def typed_shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Any,
                    in_specs: Any = _compat.INFER, mesh: Any = None,
                    axis_names: Any = frozenset(), check_vma: bool = True) -> Any:
    """`jax.shard_map` for an existing raw per-shard function, with spmdtyped's checks.

    `f` is unchanged: it receives and returns raw JAX values. Its collectives, outputs and
    inputs are checked (see the module docs); the executed program is `jax.shard_map`'s.
    Same arguments and defaults as `jax.shard_map`: `mesh` defaults to the mesh of
    `jax.set_mesh(...)`, `in_specs` to `jax.sharding.Infer` (the arguments' shardings); the
    decorator form `@typed_shard_map(out_specs=...)` and `functools.partial` / jitted bodies
    work. With `check_vma=False` the program is plain `jax.shard_map`'s, and its body is also
    traced with the checks on (as `infer(..., check_vma=False)` does): each violation is a
    `CheckVmaWarning` marked `check_vma=False:` with its code and line. The program that
    runs is walked for what it computes: a gradient its autodiff leaves unsummed over an
    axis its output is replicated over (SPMD410), or sums twice through a differentiated
    psum (SPMD411), or computes from a cotangent left partial (SPMD412), is raised
    (`_engine.unchecked`); its Shard / Partial bugs (a bias added before the psum, read
    from the program that runs, for a body JAX rejects with the checks on) are warned as
    well.

    Inside a trace (`jax.jit`, `jax.grad`, ...) the body is traced once: the shard_map
    equation JAX staged is walked with the strict rules, and it is the program JAX lowers.
    Called eagerly, the first call per input signature traces and walks the program before
    it runs.

    **Arguments:** as `jax.shard_map`.

    **Returns:** the shard-mapped function (global arrays in, global arrays out).

    **Raises:** on the first call with a given input signature, the first `SpmdTypeError`:
    SPMD1xx/2xx/3xx at the user's line (`err.source`), SPMD401/402/403 at the boundary,
    SPMD501 for unknown axes; JAX's own manual-axis errors translated (`_jax_errors.TABLE`).

    !!! Example
        ```python
        with jax.set_mesh(mesh):
            step = st.adapters.typed_shard_map(raw_step, in_specs=(P(), P("dp")),
                                               out_specs=P())
            loss = step(params, batch)
        ```
    """
    axis_names = set(_validate.shard_map_args(f, mesh, in_specs, out_specs, axis_names,
                                              "typed_shard_map", infer=_compat.INFER,
                                              hijax=True))
    # (out_specs=None is JAX's empty pytree: a body that returns None, as jax.shard_map takes it)
    if f is None:
        return functools.partial(typed_shard_map, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    name = fn_name(f)
    where = f"typed_shard_map({name})"
    if mesh is not None:
        check_mesh_specs(mesh, in_specs, out_specs, axis_names, where)

    # the program is `jax.shard_map(f)` itself: the jaxpr walk finds what JAX accepts and the
    # strict rules reject; a program JAX rejects is traced again with its outputs checked
    # (`run_infer`), for spmdtyped's code at the line
    smapped = _compat.shard_map(raw_outputs(f), mesh=mesh, in_specs=in_specs,
                                out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    plain = smapped
    #: input signature -> the checked program (a `jax.jit` of it, its trace cached)
    traced: dict[Any, Callable[..., Any]] = {}

    def first_violation(m: Any, specs: Any, args: tuple[Any, ...],
                        fallback: SpmdTypeError | None) -> SpmdTypeError | None:
        return _first_violation(f, args, mesh=m, in_specs=specs, out_specs=out_specs,
                                axis_names=axis_names, where=where, fallback=fallback)

    def trace(m: Any, specs: Any, args: tuple[Any, ...], thunk: Callable[[], Any]) -> Any:
        with in_spec_errors(where, "typed_shard_map"):
            try:
                with jax_errors(where):
                    return thunk()
            except SpmdTypeError as e:
                # a rejected program: report its first violation in program order (the jaxpr
                # walk, when JAX accepts the program), else the second trace's
                raise raised_as(first_violation(m, specs, args, e) or e, e) from e.__cause__
            except Exception as jax_error:
                if rejects_in_specs(jax_error):
                    # an argument against its in_spec, which JAX checks before the body:
                    # SPMD403 (`in_spec_errors`), not a violation the second trace finds in
                    # the body
                    raise
                # JAX's error without a manual-axis message (e.g. the bare AssertionError of
                # an unknown axis on jax 0.10): the second trace names it, or JAX's stands
                found = first_violation(m, specs, args, None)
                if found is None:
                    raise
                raise raised_as(found, jax_error) from jax_error

    #: input signatures whose check_vma=False body was analysed
    analysed: set[Any] = set()
    #: (code, file, line) of what was warned for a check_vma=False body
    warned: set[tuple[str, str | None, int | None]] = set()

    def vma_findings(m: Any, specs: Any, args: tuple[Any, ...]) -> list[SpmdTypeError]:
        # `infer(..., check_vma=False)`'s trace (`run_infer`, the checks on); a body JAX
        # cannot trace with the checks on for another reason runs as JAX's, unanalysed
        try:
            rep = run_infer(f, args, mesh=m, in_specs=specs, out_specs=out_specs,
                            axis_names=axis_names, where=where)
        except Exception:  # noqa: BLE001 - e.g. Python control flow on per-device values
            return []
        return rep.violations

    def check(eqn: Any, m: Any) -> None:
        # the engine (`_engine.check`): the same function `infer` calls
        got = check_shard_map(eqn, manual=manual_axes(m, axis_names), mesh=m,
                              source=function_source(f), where=where)
        if got.violations:
            raise got.violations[0]
        for note in got.wrong:
            # a check_vma=False body's Shard / Partial bug read from the program that runs,
            # unless its checked trace warned it (JAX rejects many such bodies with the checks
            # on: a custom_vjp region written for check_vma=False)
            at = (note.code, note.file, note.line)
            if at not in warned:
                warned.add(at)
                warnings.warn(CheckVmaWarning(note), stacklevel=4)

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        m = resolve_mesh(mesh, where)
        if mesh is None:
            check_mesh_specs(m, in_specs, out_specs, axis_names, where)
        if not check_vma:  # JAX's program unchecked; its boundary errors with codes
            specs = resolve_in_specs(in_specs, args)
            check_in_structure(specs, args, where, "typed_shard_map")
            key = (signature_key(args), id(m), str(m))
            if key not in analysed:  # the body as if the checks were on: warnings
                analysed.add(key)
                for v in vma_findings(m, specs, args):
                    warned.add((v.code, v.file, v.line))
                    warnings.warn(CheckVmaWarning(v), stacklevel=2)
            # the program that runs is walked for what it computes (`_engine.unchecked`:
            # a gradient JAX leaves unsummed or sums twice there, SPMD410 / SPMD411 / SPMD412), then
            # runs as JAX's
            with error_context(function=name, mesh=m, manual=manual_axes(m, axis_names)), \
                    in_spec_errors(where, "typed_shard_map"), jax_errors(where):
                return run_checked(plain, args, check=lambda eqn: check(eqn, m),
                                   cache=traced, key=lambda: (key, "unchecked"),
                                   trace=lambda thunk: thunk())
        with error_context(function=name, mesh=m, manual=manual_axes(m, axis_names)):
            specs = resolve_in_specs(in_specs, args)
            check_in_structure(specs, args, where, "typed_shard_map")
            return run_checked(smapped, args, check=lambda eqn: check(eqn, m), cache=traced,
                               key=lambda: (signature_key(args), id(m), str(m)),
                               trace=lambda thunk: trace(m, specs, args, thunk))

    named_like(wrapped, f)
    wrapped.__wrapped_shard_map__ = plain  # type: ignore[attr-defined]
    return errors_at_the_call(wrapped)


def checking(fn: Callable[..., Any] | None = None, /) -> Any:
    """Check existing raw shard_map code, unedited: `st.adapters.checking(step)` is `step`
    with every shard_map it stages checked by the engine (the one `infer`, `typed_shard_map`
    and `st.shard_map` run) before it runs: the `jax.shard_map(...)` calls of `step` and of
    the functions it calls, jitted or not, wherever they were written.

    The first call per input signature traces `step` (`jax.make_jaxpr`; arguments that are
    not arrays are closed over), checks each staged shard_map equation with its mesh, manual
    axes and specs, and raises the first violation at the user's line; then `step` runs as
    it is (a `jax.jit` reuses that trace). Every manual-axis error JAX raises (`tanh` of an
    Unreduced value, a loop carry that changes state, ...) is raised as the `SpmdTypeError`
    of its code (`_errors.jax_messages.TABLE`), JAX's exception chained. Nothing in JAX is
    replaced: a step that can only run eagerly (Python control flow on per-device values)
    runs unchecked, as `typed_shard_map` runs such a body.

    `with st.adapters.checking():` (no function) translates JAX's errors raised in the block
    only, and warns: the engine needs the step (it used to replace `jax.shard_map`
    process-wide, which it no longer does).

    **Raises:** `SpmdTypeError` (its `.source` the user's line when one is known).

    !!! Example
        ```python
        train_step = st.adapters.checking(train_step)
        loss = train_step(params, batch)   # its shard_map bodies are checked
        ```
    """
    if fn is None:
        warnings.warn("st.adapters.checking() as a block only translates JAX's errors: pass "
                      "the step to check its shard_maps: st.adapters.checking(step)(...)",
                      DeprecationWarning, stacklevel=2)
        return _translating()
    if not callable(fn):
        raise error("SPMD509", f"st.adapters.checking(fn): fn must be a function, not "
                    f"{type(fn).__name__}", fix="st.adapters.checking(step)(*args)")
    seen: set[Any] = set()

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        with _translating():
            key = signature_key((args, kwargs))
            if key not in seen:
                closed = _traced(fn, args, kwargs)
                notes: list[SpmdTypeError] = []
                found = [] if closed is None else check_staged(closed, where="checking()",
                                                               notes=notes)
                if found:
                    raise found[0]
                for note in notes:   # a check_vma=False program's output that varies
                    warnings.warn(CheckVmaWarning(note), stacklevel=2)
                seen.add(key)
            return fn(*args, **kwargs)

    return checked


def _traced(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`fn`'s program, traced on its array arguments (the others closed over); None when it
    cannot be traced (a step that only runs eagerly): it then runs unchecked."""
    rejected: list[ShardMapCall] = []   # the shard_map call JAX's error was raised in

    def call(tree: Any) -> Any:
        a, kw = tree
        try:
            return fn(*a, **kw)
        except SpmdTypeError:
            raise
        except Exception as e:  # an axis the mesh lacks in a raw collective: SPMD501
            got = shard_map_call(e)
            if got is not None:
                rejected.append(got)
            mesh = traceback_mesh(e)
            unknown = None if mesh is None else unknown_axis(
                e, mesh, _compat.mesh_axis_names(mesh))
            if unknown is None:
                raise
            raise raised_as(unknown, e) from e

    # (Python numbers too are closed over: a step may use them as static values)
    on_arrays, leaves = over_arrays(call, (args, kwargs), numbers=False)
    try:
        return jax.make_jaxpr(on_arrays)(*leaves)
    except SpmdTypeError:
        raise
    except Exception as e:  # noqa: BLE001 - JAX's manual-axis errors are raised translated
        found = translate(e, "checking()")
        if found is None:
            return None
        if found.code.startswith("SPMD4") and rejected:
            # a boundary error (an output against its out_spec): the rejected shard_map
            # traced again as `typed_shard_map` does (`run_infer`: its outputs checked by the
            # engine), for the first violation in program order, the cause (the psum missing
            # after a row-parallel projection) rather than its symptom at the boundary
            found = _rejected_call_violation(rejected[-1], found)
        raise raised_as(found, e) from e


def _first_violation(f: Callable[..., Any], args: Any, *, mesh: Any, in_specs: Any,
                     out_specs: Any, axis_names: Any, where: str,
                     fallback: SpmdTypeError | None) -> SpmdTypeError | None:
    """The first violation in program order of the shard_map of `f` JAX rejected, found by
    tracing it again with its outputs checked (`run_infer`); `fallback` when there is none or
    that trace fails too (an argument JAX refused, e.g. a dim its mesh axis does not divide:
    JAX's error stands). spmdtyped's own errors of that trace are raised."""
    try:
        rep = run_infer(f, args, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                        axis_names=axis_names, where=where)
    except SpmdTypeError:
        raise
    except Exception:  # noqa: BLE001 - see the docstring
        return fallback
    return rep.violations[0] if rep.violations else fallback


def _rejected_call_violation(c: ShardMapCall, boundary: SpmdTypeError) -> SpmdTypeError:
    """`_first_violation` of the rejected shard_map call `c` of a step; else JAX's boundary
    error `boundary`, at the `def` of the body."""
    fallback = located(boundary, function_source(c.f))   # (as it is when it names a line)
    if c.in_specs is _compat.INFER:
        return fallback
    return _first_violation(c.f, c.args, mesh=c.mesh, in_specs=c.in_specs,
                            out_specs=c.out_specs, axis_names=set(c.axis_names or ()),
                            where="checking()", fallback=fallback) or fallback


@contextlib.contextmanager
def _translating() -> Iterator[None]:
    """JAX's manual-axis errors raised in the block as spmdtyped's, at the user's line (its
    rejection of an argument against its in_spec too: SPMD403, as the other faces raise it)."""
    try:
        with in_spec_errors("checking()", "st.adapters.checking"), jax_errors("checking()"):
            yield
    except SpmdTypeError as e:
        where = None if e.source is not None else raised_at(e)
        if where is None:
            raise
        raise raised_as(located(e, where), e).with_traceback(e.__traceback__) from e.__cause__

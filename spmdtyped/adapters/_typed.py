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
   traced again with `jax.lax`'s collectives routed through `spmdtyped.lax` (`checked_lax()`)
   and the outputs checked against `out_specs` (`run_infer`, as `infer` does), so the error
   names spmdtyped's code at the user's line instead of JAX's exception (chained).

Inputs are checked against `in_specs` (structure SPMD402, unknown axes SPMD501, JAX's
sharding mismatch as SPMD403). The executed program is `jax.shard_map(f)`'s.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

from .. import _compat, _validate
from .._boundary.shard_map import check_in_structure, check_mesh_specs, in_spec_errors
from .._engine.check import check_shard_map, run_checked
from .._engine.patching import Patch
from .._engine.walk import exception_source, function_source, located
from .._errors import SpmdTypeError, error_context
from .._errors.jax_messages import jax_errors
from ._conventions import (
    checked_lax,
    fn_name,
    manual_axes,
    named_like,
    raw_outputs,
    resolve_in_specs,
    resolve_mesh,
    signature_key,
)
from ._infer import run_infer


def typed_shard_map(f: Callable[..., Any] | None = None, /, *, out_specs: Any,
                    in_specs: Any = _compat.INFER, mesh: Any = None,
                    axis_names: Any = frozenset(), check_vma: bool = True) -> Any:
    """`jax.shard_map` for an existing raw per-shard function, with spmdtyped's checks.

    `f` is unchanged: it receives and returns raw JAX values. Its collectives, outputs and
    inputs are checked (see the module docs); the executed program is `jax.shard_map`'s.
    Same arguments and defaults as `jax.shard_map`: `mesh` defaults to the mesh of
    `jax.set_mesh(...)`, `in_specs` to `jax.sharding.Infer` (the arguments' shardings); the
    decorator form `@typed_shard_map(out_specs=...)` and `functools.partial` / jitted bodies
    work. With `check_vma=False` it is plain `jax.shard_map`.

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
                                              "typed_shard_map", infer=_compat.INFER))
    # (out_specs=None is JAX's empty pytree: a body that returns None, as jax.shard_map takes it)
    if f is None:
        return functools.partial(typed_shard_map, mesh=mesh, in_specs=in_specs,
                                 out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    name = fn_name(f)
    where = f"typed_shard_map({name})"
    if mesh is not None:
        check_mesh_specs(mesh, in_specs, out_specs, axis_names, where)

    # the program is `jax.shard_map(f)` itself: the jaxpr walk finds what JAX accepts and the
    # strict rules reject; a program JAX rejects is traced again with `jax.lax` routed through
    # `spmdtyped.lax` and its outputs checked (`run_infer`), for spmdtyped's code at the line
    smapped = _compat.shard_map(raw_outputs(f), mesh=mesh, in_specs=in_specs,
                                out_specs=out_specs, axis_names=axis_names, check_vma=check_vma)
    plain = smapped
    #: input signature -> the checked program (a `jax.jit` of it, its trace cached)
    traced: dict[Any, Callable[..., Any]] = {}

    def first_violation(m: Any, specs: Any, args: tuple[Any, ...],
                        fallback: SpmdTypeError | None) -> SpmdTypeError | None:
        try:
            rep = run_infer(f, args, mesh=m, in_specs=specs, out_specs=out_specs,
                            axis_names=axis_names, where=where)
        except SpmdTypeError:
            raise
        except Exception:  # noqa: BLE001 - the routed trace fails too (an argument JAX
            return fallback  # refused, e.g. a dim its mesh axis does not divide): JAX's stands
        return rep.violations[0] if rep.violations else fallback

    def trace(m: Any, specs: Any, args: tuple[Any, ...], thunk: Callable[[], Any]) -> Any:
        with in_spec_errors(where, "typed_shard_map"):
            try:
                with jax_errors(where):
                    return thunk()
            except SpmdTypeError as e:
                # a rejected program: report its first violation in program order (the jaxpr
                # walk, when JAX accepts the unrouted program), else the routed one
                raise first_violation(m, specs, args, e) or e from e.__cause__
            except Exception as jax_error:
                # JAX's error without a manual-axis message (e.g. the bare AssertionError of
                # an unknown axis on jax 0.10): the routed trace names it, or JAX's stands
                found = first_violation(m, specs, args, None)
                if found is None:
                    raise
                raise found from jax_error

    def check(eqn: Any, m: Any) -> None:
        # the engine (`_engine.check`): the same function `infer` calls
        got = check_shard_map(eqn, manual=manual_axes(m, axis_names), mesh=m,
                              source=function_source(f), where=where)
        if got.violations:
            raise got.violations[0]

    @functools.wraps(f)
    def wrapped(*args: Any) -> Any:
        m = resolve_mesh(mesh, where)
        if mesh is None:
            check_mesh_specs(m, in_specs, out_specs, axis_names, where)
        if not check_vma:  # JAX's program unchecked; its boundary errors with codes
            check_in_structure(resolve_in_specs(in_specs, args), args, where, "typed_shard_map")
            with in_spec_errors(where, "typed_shard_map"), jax_errors(where):
                return plain(*args)
        with error_context(function=name, mesh=m, manual=manual_axes(m, axis_names)):
            specs = resolve_in_specs(in_specs, args)
            check_in_structure(specs, args, where, "typed_shard_map")
            return run_checked(smapped, args, check=lambda eqn: check(eqn, m), cache=traced,
                               key=lambda: (signature_key(args), id(m), str(m)),
                               trace=lambda thunk: trace(m, specs, args, thunk))

    named_like(wrapped, f)
    wrapped.__wrapped_shard_map__ = plain  # type: ignore[attr-defined]
    return wrapped


#: `jax.shard_map` -> `typed_shard_map` while `checking()` is active
_SHARD_MAP_ROUTE = Patch(((jax, "shard_map"),),
                         lambda _originals: {(jax, "shard_map"): typed_shard_map})


@contextlib.contextmanager
def checking() -> Iterator[None]:
    """Check the raw shard_map code run inside the block, unedited: every `jax.shard_map(...)`
    called in it is `typed_shard_map` (the engine `infer` runs, on the program JAX stages),
    and `jax.lax`'s collectives are routed through `spmdtyped.lax` (`checked_lax()`).

    Every manual-axis error JAX raises in the block (`tanh` of an Unreduced value, a loop
    carry that changes state, ...) is raised as the `SpmdTypeError` of its code
    (`_errors.jax_messages.TABLE`), JAX's exception chained, at the user's line when the
    traceback has it. Process-wide while active (meant for a test or a porting session); a
    function wrapped by `jax.shard_map` before the block, or names bound before it
    (`from jax import shard_map`, `from jax.lax import psum`), are checked by the routed
    collectives only.

    **Raises:** `SpmdTypeError` (its `.source` the user's line when one is known).

    !!! Example
        ```python
        with st.adapters.checking():
            loss = train_step(params, batch)   # its jax.shard_map bodies are checked
        ```
    """
    try:
        with checked_lax(), _SHARD_MAP_ROUTE.active(), jax_errors("checking()"):
            yield
    except SpmdTypeError as e:
        # a routed collective's error carries no line: the traceback has the user's
        where = exception_source(e) if getattr(e, "source", None) is None else None
        if where is None:
            raise
        raise located(e, where).with_traceback(e.__traceback__) from e.__cause__

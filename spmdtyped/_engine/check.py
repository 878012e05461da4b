"""THE checking engine's entry points (issue 27): one function checks a traced shard_map
program, and every face calls it: `st.adapters.infer`, `typed_shard_map`, `st.shard_map` and
every shard_map a step wrapped by `st.adapters.checking(step)` stages (`check_staged`).

`check_shard_map(eqn, ...)` walks the shard_map equation JAX staged (its body jaxpr, with
every nested jaxpr): the four states (`walk.Walk`: collectives, elementwise ops, JAX's hidden
casts), the outputs against out_specs (SPMD401 at the function's `def`), then Shard / Partial /
Rep (`refine_walk.check_program`: control flow, the gradients the body computes, vmap,
custom_vjp/jvp, opaque calls and custom ops). Violations come out in that order, each located at the user's line
(the equation's `source_info`); the runtimes raise the first, `infer` lists them all.

`run_checked(...)` is how a runtime gets the jaxpr without tracing the body twice: inside a
caller's trace (`jax.jit`, `jax.grad` under jit, ...) the shard_map equation the call just
staged is walked; called eagerly, the program is traced and checked once per input signature.
Nothing is routed or patched while the body traces: a `jax.grad` in the body is a set of
equations of the jaxpr (`gradients`), and the compiled program is the raw one.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import gc
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental.hijax import HiPspec

from .. import _compat, _rules, _surface
from .._errors import ALLOW_SCOPES, WRONG_EITHER_WAY, SpmdTypeError, built_errors, error
from .._frames import in_package_note, is_installed, package_call_site
from .._rules import SpmdType
from .primitives import FOLLOWED
from .refine_walk import check_program, check_unchecked
from .unchecked import unchecked_violations
from .walk import Walk, boundary_source, located, user_frame

#: a `(file, line)` of the user's code, or None
Source = "tuple[str, int] | None"


@dataclasses.dataclass
class Checked:
    """What the engine found on one shard_map program."""

    walk: Walk
    in_types: list[SpmdType]
    out_types: list[SpmdType]
    #: what a face warns and does not raise: a `check_vma=False` program's output that
    #: differs between devices under an out_spec replicated over the axis (SPMD401)
    notes: list[SpmdTypeError] = dataclasses.field(default_factory=list)
    #: what a face warns too: a `check_vma=False` program's Shard / Partial bugs, read by the
    #: refinement walk from the program that runs (`WRONG_EITHER_WAY` codes: wrong with the
    #: checks on or off; the walk's other codes are about states JAX does not check there)
    wrong: list[SpmdTypeError] = dataclasses.field(default_factory=list)

    @property
    def violations(self) -> list[SpmdTypeError]:
        return self.walk.violations


def shard_map_eqn(closed_or_eqn: Any) -> Any:
    """The shard_map equation of a traced program (a ClosedJaxpr / Jaxpr holding one), or the
    equation itself; None when there is none."""
    jaxpr = getattr(closed_or_eqn, "jaxpr", None)
    if jaxpr is None:
        return closed_or_eqn
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for e in jaxpr.eqns:
        if _compat.primitive_name(e) == "shard_map":
            return e
    return None


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused (when it runs) for the walks: they allocate a
    few short-lived objects per equation and free them all at the end, and each collection the
    allocations trigger would traverse the whole traced program. Measured on the 128-layer
    drop-in benchmark: a second full collection per trace + lower, about 100 ms, more than
    the walks' own cost (docs/performance.md §2). Nothing the walks build is cyclic garbage
    (`tests/test_engine_memo.py` holds them to it: a cycle would keep a walk's memos alive
    until a collection during the lowering, and turning the collector on again would start
    one). The check that paused it turns it back on (a program that turned it off keeps it
    off; a second thread checking meanwhile finds it paused and leaves it to the first)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def check_shard_map(eqn: Any, *, manual: Sequence[str], mesh: Any, source: Any, where: str,
                    steps: bool = False, refine: bool = True, strict: bool = False) -> Checked:
    """Check the shard_map equation `eqn` (see `run_checked`) with every rule of the engine;
    `source` is the function's `def` (boundary errors), `where` names the API in boundary
    messages (`st.shard_map(f)`). `refine=False` walks the four states only (never used by a
    face: kept for measuring the refinement's cost). `strict=True` (`st.shard_map(...,
    strict=True)`): every sum of an in_spec Shard over its own axis is SPMD108."""
    with _collector_paused():
        got = _check(eqn, manual=manual, mesh=mesh, source=source, where=where, steps=steps,
                     refine=refine, strict=strict)
        # freed while the collector is paused: their deallocation takes back the allocations
        # they counted, so that turning the collector on again does not start a collection
        # that traverses them (measured: 4-5 ms of the 128-layer benchmark's check)
        got.walk.release()
        return got


def _check(eqn: Any, *, manual: Sequence[str], mesh: Any, source: Any, where: str,
           steps: bool, refine: bool, strict: bool) -> Checked:
    walk = Walk(record_steps=steps)
    inner = eqn.params["jaxpr"]
    inner = getattr(inner, "jaxpr", inner)
    if hi_specs(eqn):
        # hijax types (`jax.experimental.hijax`, through `typed_shard_map` or `checking`):
        # their values and specs are the type's own, which no rule of the engine reads; JAX
        # checks them (listed as a gap of the walk)
        walk.mismatches.append(f"{where}: {_HI_REASON}")
        return Checked(walk, [], [])
    if not eqn.params.get("check_vma", True):
        # JAX recorded no state: the program that runs is walked for what it computes
        # (`unchecked`: the gradients its autodiff leaves unsummed or sums twice)
        found, notes, varying = unchecked_violations(eqn, manual, where)
        for e, at in found:
            walk.violation(e, at, "")
        walk.violations[:] = [v for v in in_program_order(inner, walk.violations, source)
                              if not opted_out(v, inner)]
        # its Shard / Partial bugs, wrong with the checks on or off (warned by the faces); not
        # in a shard_map autodiff staged (the transpose of the user's: its cotangents' specs
        # are no slices of the user's arrays, and its forward pass is the one walked)
        refined = Walk()
        if refine and not _compat.eqn_transforms(eqn):
            try:
                check_unchecked(eqn, manual, mesh, refined.violation, varying)
            except SpmdTypeError:
                raise
            except Exception as e:  # noqa: BLE001 - a gap of the walk, never the user's crash
                walk.mismatches.append(f"refinement walk (check_vma=False): {type(e).__name__}: {e}")
        wrong = at_call_sites(inner, [v for v in in_program_order(inner, refined.violations, source)
                                      if v.code in WRONG_EITHER_WAY and not opted_out(v, inner)])
        return Checked(walk, [], [], [located(e, at) for e, at in notes], wrong)
    producers = walk.jaxpr(inner)
    in_types = [_compat.aval_type(v.aval) for v in inner.invars]
    returned = [boundary_source(v, producers) for v in inner.outvars]
    out_types = [_compat.aval_type(v.aval) for v in returned]
    for i, (t, spec) in enumerate(zip(out_types, eqn.params["out_specs"], strict=True)):
        part, un, red, _kind = _compat.spec_parts(spec)
        try:
            _rules.check_out_spec(t, part, un, red, manual, where=where,
                                  spec=_rules.spec_text(spec))
        except SpmdTypeError as e:
            walk.violation(e, source, f"at the shard_map boundary: output leaf {i}")
    if refine:
        refine_into(walk, eqn, manual, mesh, strict=strict)
    if walk.violations:
        caught = _CAUGHT_IN_BODY.get()
        walk.violations[:] = at_call_sites(inner, [
            v for v in in_program_order(inner, walk.violations, source)
            if not opted_out(v, inner) and not raised_before(v, caught)])
    return Checked(walk, in_types, out_types)


#: why a shard_map of hijax types is not walked (`_check`)
_HI_REASON = ("a hijax type's spec (`jax.experimental.hijax.HiPspec`): the engine reads no "
              "hijax type; JAX's own checks apply to this shard_map")


def hi_specs(eqn: Any) -> bool:
    """Whether an in_spec or out_spec of the shard_map equation `eqn` is a hijax type's."""
    return any(isinstance(s, HiPspec)
               for s in jax.tree_util.tree_leaves((eqn.params.get("in_specs", ()),
                                                   eqn.params.get("out_specs", ()))))


def staged_shard_maps(jaxpr: Any) -> Any:
    """Every shard_map equation of a traced program (a ClosedJaxpr or Jaxpr), in program
    order, at any depth (inside `jax.jit`, `scan`, `cond`, ...; not inside another's body);
    `check_vma=False` ones too (`check_shard_map` walks what they compute)."""
    for e in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        if _compat.primitive_name(e) == "shard_map":
            yield e
            continue
        for sub in _compat.sub_jaxprs(e):
            yield from staged_shard_maps(sub)


def check_staged(jaxpr: Any, *, where: str,
                 notes: list[SpmdTypeError] | None = None) -> list[SpmdTypeError]:
    """The violations of every shard_map a traced program stages (`staged_shard_maps`), each
    checked by `check_shard_map` with its own mesh and manual axes; `where` names the API in
    boundary messages. Each program's `Checked.notes` and `Checked.wrong` are added to `notes`
    when given."""
    found: list[SpmdTypeError] = []
    for eqn in staged_shard_maps(jaxpr):
        got = check_shard_map(eqn, manual=_compat.shard_map_manual_axes(eqn),
                              mesh=eqn.params["mesh"],
                              source=_compat.jaxpr_source(eqn.params["jaxpr"]), where=where)
        found.extend(got.violations)
        if notes is not None:
            notes.extend(got.notes + got.wrong)
    return found


#: the errors a typed value's check built while the body traced (`run_checked` sets it
#: around the check): `(code, {(file, line) of the stack})`, as `_errors.built_errors` notes them
_CAUGHT_IN_BODY: contextvars.ContextVar[Sequence[tuple[str, frozenset[tuple[str, int]]]]] = \
    contextvars.ContextVar("spmdtyped_caught_in_body", default=())


def raised_before(v: SpmdTypeError, caught: Sequence[tuple[str, frozenset[tuple[str, int]]]]
                  ) -> bool:
    """Whether a typed value's check built the error `v` reports (its code, at its line) while
    the body traced: the body caught it, and its equations are still in the program."""
    where = (v.file, v.line)
    return any(code == v.code and where in lines for code, lines in caught)


_ALLOW_SCOPE = "spmdtyped_allow_"


def _allow_scope(codes: frozenset[str]) -> Any:
    return jax.named_scope(_ALLOW_SCOPE + "_".join(sorted(codes)))


ALLOW_SCOPES.append(_allow_scope)


def opted_out(v: SpmdTypeError, body: Any) -> bool:
    """Whether the violation `v` lies in a `with st.allow(code):` block of the body: an
    equation traced in the block (its name stack holds the block's scope) with `v`'s line on
    its stack (the line itself, or a call the block holds: the `jax.grad` line SPMD410 names
    traced its backward pass)."""
    where = (v.file, v.line)
    for e in _eqns(body):
        stack = str(getattr(getattr(e, "source_info", None), "name_stack", ""))
        if _ALLOW_SCOPE not in stack:
            continue
        # the scope as JAX prints it inside a transform: `transpose(jvp(spmdtyped_allow_X))`
        codes = {c.rstrip(")") for part in stack.split(_ALLOW_SCOPE)[1:]
                 for c in part.split("/")[0].split("_")}
        if v.code in codes and any((f, n) == where for f, n, _ in _compat.eqn_frames(e)):
            return True
    return False


#: installed packages' functions that have a counterpart that knows the states
#: (`at_call_sites`): the package, the functions (any of them on the stack between the
#: violation and the user's call), the hint
_COUNTERPARTS = (("optax", frozenset({"clip_by_global_norm", "global_norm", "norm", "tree_norm",
                                      "tree_l2_norm"}),
                  "st.clip_by_global_norm / st.global_norm for optax's clipping and global norm"),)


def at_call_sites(body: Any, violations: list[SpmdTypeError]) -> list[SpmdTypeError]:
    """`violations`, each one located in an installed package's code (the `sqrt` of optax's
    global norm, inside `optax.clip_by_global_norm`) named at the user's line that called into
    the package (`_frames.package_call_site`), the package's own line kept as a detail. The fix
    is made where the user calls the package (pass it a reduced value, or use a counterpart that knows
    the states: `st.clip_by_global_norm`)."""
    wanted = {(v.file, v.line) for v in violations
              if v.file is not None and v.line is not None and is_installed(v.file)}
    if not wanted:
        return violations
    sites: dict[tuple[str, int], tuple[str, int, str]] = {}
    called: dict[tuple[str, int], set[str]] = {}   # the functions between the two
    for e in _eqns(body):
        frames = _compat.eqn_frames(e)
        where = user_frame(frames)
        if where in wanted and where not in sites:
            site = package_call_site(frames, where)
            if site is not None:
                sites[where] = site
                start = next(i for i, (f, n, _) in enumerate(frames) if (f, n) == where)
                called[where] = {fn for _, _, fn in frames[start:frames.index(site, start)]}
    out = []
    for v in violations:
        site = None if v.file is None or v.line is None else sites.get((v.file, v.line))
        if site is None or v.file is None or v.line is None:
            out.append(v)
            continue
        file, line, fn = site
        inside = f"at {v.file}:{v.line}"
        counterpart = next((hint for package, functions, hint in _COUNTERPARTS
                            if f"{os.sep}{package}{os.sep}" in v.file
                            and functions & called[(v.file, v.line)]), None)
        unlocated = error(v.code, v.headline, axes=v.axes, states=v.states, fix=v.fix, op=v.op,
                          details=[d for d in v.details if d != inside])
        note = in_package_note((v.file, v.line), fn)
        out.append(located(unlocated, (file, line),
                           note + (f"; or use {counterpart}" if counterpart else "")))
    return out


def _eqns(jaxpr: Any) -> Any:
    for e in jaxpr.eqns:
        yield e
        for sub in _compat.sub_jaxprs(e):
            yield from _eqns(getattr(sub, "jaxpr", sub))


def in_program_order(body: Any, violations: list[SpmdTypeError],
                     source: Any) -> list[SpmdTypeError]:
    """`violations` in the order of the body's equations (the four-state and the refinement
    walks each report in program order; merged here), boundary errors last: the first one is
    the cause the runtimes raise (e.g. the opaque kernel that drops an axis before the psum
    of its Invariant result). A violation's position is that of the first top-level equation
    whose Python stack holds its line."""
    order: dict[tuple[str, int], int] = {}
    for i, e in enumerate(body.eqns):
        for file, line, _fn in _compat.eqn_frames(e):
            order.setdefault((file, line), i)
    last = len(body.eqns)

    def position(v: SpmdTypeError) -> int:
        where = (v.file, v.line)
        if v.code.startswith("SPMD4") and source is not None and where == tuple(source):
            return last + 1
        return order.get(where, last)  # type: ignore[arg-type]

    return sorted(violations, key=position)


def refine_into(walk: Walk, eqn: Any, manual: Sequence[str], mesh: Any, *,
                strict: bool = False) -> None:
    """The refinement walk of a shard_map equation, its violations added to `walk`. A failure
    of the walk itself is a gap, listed in `walk.mismatches` (as the rule table's are), never
    a crash of the user's program."""
    try:
        check_program(eqn, manual, mesh, walk.violation, strict=strict, views=walk.views)
    except SpmdTypeError:
        raise
    except Exception as e:  # noqa: BLE001 - see the docstring
        walk.mismatches.append(f"refinement walk: {type(e).__name__}: {e}")


def signature_key(args: Any) -> Any:
    """The input signature a checked program is cached under (tree, types with shardings)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return tree, tuple(str(jax.typeof(leaf)) + str(getattr(leaf, "sharding", ""))
                       if hasattr(leaf, "shape") else repr(leaf) for leaf in leaves)


def is_array(x: Any) -> bool:
    """An argument `jax.make_jaxpr` takes as an input (the rest are closed over)."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, complex, bool)) \
        or hasattr(x, "__jax_array__")


def over_arrays(call: Callable[[Any], Any], tree: Any, *, numbers: bool = True
                ) -> tuple[Callable[..., Any], list[Any]]:
    """`(g, leaves)` with `g(*leaves) == call(tree)`: `leaves` are the array leaves of the
    pytree `tree` (`is_array`; Python numbers too unless `numbers=False`), every other leaf
    closed over, so that `jax.make_jaxpr(g)(*leaves)` traces `call` on any arguments."""
    flat, treedef = jax.tree_util.tree_flatten(tree)
    arrays = [i for i, x in enumerate(flat) if is_array(x)
              and (numbers or not isinstance(x, (int, float, complex, bool)))]

    def g(*xs: Any) -> Any:
        full = list(flat)
        for i, x in zip(arrays, xs, strict=True):
            full[i] = x
        return call(jax.tree_util.tree_unflatten(treedef, full))

    return g, [flat[i] for i in arrays]


def is_tracer(x: Any) -> bool:
    return isinstance(x, jax.core.Tracer)


def run_checked(smapped: Callable[..., Any], args: tuple[Any, ...], *,
                check: Callable[[Any], None], cache: dict[Any, Callable[..., Any]],
                key: Callable[[], Any], trace: Callable[[Callable[..., Any]], Any]) -> Any:
    """Run the shard-mapped function `smapped` on `args`, its program checked by `check` (given
    the shard_map equation), tracing the user's body once.

    - Inside a caller's trace: `smapped` is bound (its equation staged in the caller's
      jaxpr) and that equation checked; under a trace that stages nothing (an eager
      `jax.grad` / `vmap`), `jax.make_jaxpr` builds it.
    - Eagerly: the first call per input signature (`key()`) traces the program
      (`jax.make_jaxpr`) and checks it; every call then runs `smapped` as `jax.shard_map`
      runs eagerly (the raw program's numbers, bit for bit, on both JAX versions; the body
      runs twice on that first call). A body that cannot be traced (Python control flow on
      its per-device values, which eager shard_map allows) runs as JAX runs it, unchecked.

    `trace(thunk)` runs a thunk that traces the body (the face's error translation goes
    there).
    """
    built: list[tuple[str, frozenset[tuple[str, int]]]] = []

    def traced(thunk: Callable[[], Any]) -> Any:
        def routed() -> Any:
            with built_errors() as got:
                try:
                    return thunk()
                finally:
                    built.extend(got)
        return trace(routed)

    def check_once(eqn: Any) -> None:
        token = _CAUGHT_IN_BODY.set(tuple(built))
        try:
            check(eqn)
        finally:
            _CAUGHT_IN_BODY.reset(token)

    if any(is_tracer(x) for x in jax.tree_util.tree_leaves(args)):
        out = traced(lambda: smapped(*args))
        eqn = _compat.staged_shard_map_eqn(out)
        if eqn is None:
            eqn = shard_map_eqn(traced(lambda: jax.make_jaxpr(smapped)(*args)))
        if eqn is not None:
            check_once(eqn)
        return out
    k = key()
    if k not in cache:
        # the first call with this signature: traced and checked before it runs
        # arguments that are not arrays (an in_spec of None: any Python object, passed as is)
        # are closed over, as JAX's eager shard_map passes them
        on_arrays, leaves = over_arrays(lambda a: smapped(*a), args)
        try:
            closed = traced(lambda: jax.make_jaxpr(on_arrays)(*leaves))
        except SpmdTypeError:
            raise
        except Exception:  # noqa: BLE001 - see below
            # a body that only runs eagerly (Python control flow on its per-device values,
            # `bool(axis_index(...) == 0)`): run as JAX runs it, unchecked (nothing to walk)
            return trace(lambda: smapped(*args))
        eqn = shard_map_eqn(closed)
        if eqn is not None:
            check_once(eqn)
        cache[k] = smapped
    # run as `jax.shard_map` runs eagerly: jax 0.12 runs the body op by op on each device,
    # whose numbers a compiled run of the traced program does not reproduce to the last bit
    return trace(lambda: smapped(*args))


class UnfollowedWarning(UserWarning):
    """`st.shard_map(..., strict=True)`: a value the engine cannot follow (see `unfollowed`)."""


#: primitive names (substrings) of host callbacks and custom calls
_CALLBACKS = ("callback", "ffi_call", "custom_call")


def unfollowed(eqn: Any) -> list[tuple[str, Any, str]]:
    """`(primitive, (file, line) or None, reason)` for each equation of the shard_map body
    `eqn` that the engine cannot follow: a host callback or custom call (its result is only
    checked for the varying axes it drops), a primitive with no rule (its result is plain
    Varying: JAX's states are still checked, Shard / Partial are dropped there)."""
    inner = eqn.params["jaxpr"]
    out = []
    for e in _eqns(getattr(inner, "jaxpr", inner)):
        name = _compat.primitive_name(e)
        if name in _surface.AXIS_PRIMITIVES:
            continue
        if any(k in name for k in _CALLBACKS):
            reason = ("a host callback or custom call: the engine cannot see inside it; its "
                      "result is checked only for the varying axes it drops (SPMD408)")
        elif name in FOLLOWED or name in _rules.PRIMITIVES:
            continue
        else:
            reason = ("no refinement rule for this primitive: its result is plain Varying "
                      "(JAX's states are checked; a Shard / Partial is dropped here)")
        out.append((name, user_frame(_compat.eqn_frames(e)), reason))
    return out

"""The report's flags (SPMD7xx): communication that a different program would not need.

Each detector reads the `Collective`s of the traced walk (their equation and the jaxpr that
holds it) and, for SPMD703, the compiled ops; none re-traces anything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _compat
from .._engine import walk as _walk
from .._engine.primitives import IDENTITIES
from .hlo import CompiledOp
from .traced import Collective, aval_bytes

#: primitives that pass a value through linearly (a sum can be moved across them)
LINEAR = frozenset({"convert_element_type", "reshape", "squeeze", "expand_dims",
                    "broadcast_in_dim", "transpose", "neg", "pvary", "mul", "div", "add",
                    "add_any", "sub", "reduce_sum"}) | IDENTITIES
#: kernels JAX cannot partition
OPAQUE = frozenset({"pure_callback", "io_callback", "ffi_call", "pallas_call", "custom_call",
                    "callback", "tpu_custom_call"})
_SLICES = frozenset({"dynamic_slice", "slice"})


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: its code, the user's line, the message and the fix as code."""

    code: str
    where: str | None
    message: str
    fix: str
    axes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "where": self.where, "message": self.message, "fix": self.fix}


#: id(jaxpr) -> (jaxpr, its consumers, its producers), for one `all_flags` call: the flags
#: of a 128-layer step read the same body jaxpr for each of its ~1500 collectives
_INDEX: dict[int, tuple[Any, dict[Any, list[Any]], dict[Any, Any]]] = {}


def _index(jaxpr: Any) -> tuple[dict[Any, list[Any]], dict[Any, Any]]:
    hit = _INDEX.get(id(jaxpr))
    if hit is not None and hit[0] is jaxpr:
        return hit[1], hit[2]
    cons: dict[Any, list[Any]] = {}
    prods: dict[Any, Any] = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if hasattr(v, "count") or not hasattr(v, "val"):  # a Var, not a Literal
                cons.setdefault(v, []).append(eqn)
        for o in eqn.outvars:
            prods[o] = eqn
    _INDEX[id(jaxpr)] = (jaxpr, cons, prods)
    return cons, prods


def _consumers(jaxpr: Any) -> dict[Any, list[Any]]:
    return _index(jaxpr)[0]


def _producers(jaxpr: Any) -> dict[Any, Any]:
    return _index(jaxpr)[1]


def _flow(start: Sequence[Any], jaxpr: Any, passthrough: frozenset[str]
          ) -> tuple[set[Any], list[Any]]:
    """The vars reached from `start` through `passthrough` primitives, and the other
    equations that consume one of them."""
    cons = _consumers(jaxpr)
    seen, stack, ends = set(start), list(start), []
    while stack:
        v = stack.pop()
        for eqn in cons.get(v, ()):
            if _compat.primitive_name(eqn) in passthrough:
                for o in eqn.outvars:
                    if o not in seen:
                        seen.add(o)
                        stack.append(o)
            elif eqn not in ends:
                ends.append(eqn)
    return seen, ends


def _only_accumulated(c: Collective) -> bool:
    """The collective's result only flows, through linear ops, into `carry_in + value`."""
    if c.carry is None or c.kind != "all-reduce":
        return False
    nconsts, ncarry = c.carry
    body = c.jaxpr
    reached, others = _flow(list(c.eqn.outvars), body, LINEAR)
    if others:
        return False
    carry_in = set(body.invars[nconsts:nconsts + ncarry])
    carry_out = list(body.outvars[:ncarry])
    ys = set(body.outvars[ncarry:])
    if reached & ys:
        return False
    producers = _producers(body)
    hits = [v for v in carry_out if v in reached]
    return bool(hits) and all(
        _compat.primitive_name(producers[v]) in ("add", "add_any")
        and any(x in carry_in for x in producers[v].invars) for v in hits if v in producers)


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _axes_text(axes: Sequence[str]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


def in_loop(cols: Sequence[Collective]) -> list[Flag]:
    out = []
    for c in cols:
        if _only_accumulated(c):
            n = c.loops[0][1] or 1
            out.append(Flag(
                "SPMD701", c.where,
                f"{c.kind} over {_axes_text(c.axes)} inside a loop of {n} iterations is only "
                f"accumulated into the carry: {n} x {_fmt(c.unit_bytes)} per step where one "
                f"reduction after the loop sends {_fmt(c.unit_bytes)}",
                f"accumulate per device (an Unreduced carry: st.pcast(w, {_axes_text(c.axes)}, "
                f"to='reduced') before the loop), then st.psum(acc, {_axes_text(c.axes)}) once",
                c.axes))
    return out


def of_invariant(cols: Sequence[Collective]) -> list[Flag]:
    out = []
    for c in cols:
        if c.phase != "forward" or c.eqn is None or c.kind not in ("all-reduce", "all-gather",
                                                                     "collective-permute"):
            continue
        producers = _producers(c.jaxpr)
        for v in c.eqn.invars:
            src = producers.get(v)
            if (src is not None and _compat.primitive_name(src) == "pvary"
                    and set(src.params.get("axes", ())) & set(c.axes)
                    and _walk.is_auto_pvary(_compat.eqn_frames(src))):
                out.append(Flag(
                    "SPMD702", c.where,
                    f"{c.kind} over {_axes_text(c.axes)} of a value that is already Invariant "
                    f"on it: {_fmt(c.bytes)} sent to compute what every device holds",
                    "drop the collective (or, for the multiplication it makes, "
                    f"x * jax.lax.axis_size({_axes_text(c.axes)}))", c.axes))
                break
    return out


def gather_into_opaque(cols: Sequence[Collective], compiled: Sequence[CompiledOp]) -> list[Flag]:
    out = []
    for c in cols:
        if c.kind != "all-gather" or c.eqn is None:
            continue
        _, ends = _flow(list(c.eqn.outvars), c.jaxpr, LINEAR - {"add", "sub", "mul", "div"})
        kernels = [_compat.primitive_name(e) for e in ends
                   if _compat.primitive_name(e) in OPAQUE]
        if kernels:
            out.append(Flag(
                "SPMD703", c.where,
                f"all-gather over {_axes_text(c.axes)} ({_fmt(c.bytes)}) feeds the opaque "
                f"kernel {kernels[0]}: every device gathers the array and runs the kernel on "
                f"all of it", "run the kernel per shard (st.opaque inside shard_map) or give it "
                "a sharding rule (custom_partitioning)", c.axes))
    for op in compiled:
        if op.kind == "all-gather" and op.origin == "compiler" and (
                op.primitive in OPAQUE or op.feeds_kernel):
            out.append(Flag(
                "SPMD703", op.where,
                f"the compiler all-gathers {_fmt(op.bytes)} over "
                f"{_axes_text(op.axes or ('?',))} to feed the opaque kernel "
                f"{op.feeds_kernel or op.primitive}",
                "run the kernel per shard (shard_map) or give it a sharding rule",
                tuple(op.axes or ())))
    return out


def psum_then_slice(cols: Sequence[Collective]) -> list[Flag]:
    out = []
    for c in cols:
        if c.kind != "all-reduce" or c.eqn is None or not c.group or c.group < 2:
            continue
        _, ends = _flow(list(c.eqn.outvars), c.jaxpr, frozenset({"convert_element_type", "pvary",
                                                                "reshape", "squeeze"}))
        if not ends or any(_compat.primitive_name(e) not in _SLICES for e in ends):
            continue
        if all(aval_bytes(e.outvars[0].aval) * c.group <= c.unit_bytes for e in ends):
            out.append(Flag(
                "SPMD704", c.where,
                f"all-reduce over {_axes_text(c.axes)} ({_fmt(c.bytes)}) of which each device "
                f"keeps a 1/{c.group} slice: a reduce-scatter sends half the bytes",
                f"jax.lax.psum_scatter(x, {_axes_text(c.axes)}, scatter_dimension=0, "
                "tiled=True)", c.axes))
    return out


#: what a gradient passes through between autodiff and the update: linear arithmetic, the
#: reshapes, concatenations and slices of a flattened buffer (`ravel_pytree` and its unravel)
#: and other sum-like collectives
GRAD_PATH = LINEAR | frozenset({
    "concatenate", "slice", "dynamic_slice", "split", "pad", "squeeze", "select_n",
    "psum", "psum_invariant", "psum2", "unreduced_psum", "reduce_scatter", "psum_scatter",
    "unreduced_reduce_scatter", "all_gather", "all_gather_invariant", "pcast"})
#: the all-reduces that sum (a pmax of gradients is no gradient reduction)
_SUMS = frozenset({"psum", "psum_invariant", "psum2", "unreduced_psum"})


def _reaches_outputs(c: Collective, parents: dict[int, tuple[Any, Any]]) -> bool:
    """The result reaches the step's outputs along a gradient's path: a gradient that is
    returned or applied (`w - lr * g`), not an activation's cotangent fed to a matmul. An
    output of a nested jaxpr (a remat, scan or shard_map body) goes on as the output of its
    equation in the enclosing jaxpr (`parents`: id(jaxpr) -> (its equation, that jaxpr))."""
    start, jaxpr = list(c.eqn.outvars), c.jaxpr
    for _ in range(64):
        reached, _ = _flow(start, jaxpr, GRAD_PATH)
        hits = [k for k, v in enumerate(jaxpr.outvars) if v in reached]
        up = parents.get(id(jaxpr))
        if not hits or up is None:
            return bool(hits)
        eqn, jaxpr = up
        start = [eqn.outvars[k] for k in hits if k < len(eqn.outvars)]
    return False


def _backward(eqn: Any) -> bool:
    return "transpose" in str(getattr(eqn.source_info, "name_stack", ""))


def _of_gradient(c: Collective) -> bool:
    """A reduction of the gradient phase: made by transposition, or of a value the backward
    pass computed (`jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)`, the flat buffer
    of `ravel_pytree(grads)`), followed back through `GRAD_PATH` equations."""
    if c.phase == "backward":
        return True
    producers = _producers(c.jaxpr)
    seen: set[Any] = set()
    stack = [v for v in c.eqn.invars if not hasattr(v, "val")]   # Vars, not Literals
    while stack:
        src = producers.get(stack.pop())
        if src is None or id(src) in seen:
            continue
        seen.add(id(src))
        if _backward(src):
            return True
        if _compat.primitive_name(src) in GRAD_PATH:
            stack.extend(v for v in src.invars if not hasattr(v, "val"))
    return False


def parameter_bytes(shard_maps: Sequence[Any]) -> dict[str, list[int]]:
    """Per mesh axis: the bytes per device of each floating-point shard_map input replicated
    along it (its in_spec does not name it): the parameters data parallelism reduces."""
    out: dict[str, list[int]] = {}
    for sm in shard_maps:
        body = sm.params.get("jaxpr")
        body = getattr(body, "jaxpr", body)
        specs = sm.params.get("in_specs") or ()
        axes = tuple(dict(getattr(sm.params.get("mesh"), "shape", {}) or {}))
        for v, spec in zip(getattr(body, "invars", ()), specs, strict=False):
            dtype = getattr(v.aval, "dtype", None)
            if dtype is None or getattr(dtype, "kind", "f") not in "fc":
                continue
            named = {a for e in _compat.spec_entries(spec) if e is not None
                     for a in ((e,) if isinstance(e, str) else e)}
            for a in axes:
                if a not in named:
                    out.setdefault(a, []).append(aval_bytes(v.aval))
    return out


def gradient_volume(cols: Sequence[Collective], shard_maps: Sequence[Any],
                    parents: dict[int, tuple[Any, Any]] | None = None) -> list[Flag]:
    """Per axis: every sum all-reduce of the gradient phase over it whose result reaches the
    outputs (per parameter, per pytree, or as one flattened buffer; once, per microbatch or
    twice) against the bytes of the parameters replicated along it."""
    out = []
    for a, params in parameter_bytes(shard_maps).items():
        ideal = sum(params)
        grads = [c for c in cols if c.kind == "all-reduce" and a in c.axes and c.eqn is not None
                 and c.primitive in _SUMS and _of_gradient(c)
                 and _reaches_outputs(c, parents or {})]
        sent = sum(c.bytes for c in grads)
        if not grads or not ideal or sent <= ideal:
            continue
        g = next((c.group for c in grads if c.group), None) or 1
        worst = max(grads, key=lambda c: (c.bytes, c.origin == "user"))
        if any(c.count > 1 for c in grads):
            fix = (f"reduce each gradient once per step: st.psum(grads, {a!r}) after the "
                   "accumulation, not inside it")
        elif {c.origin for c in grads} >= {"user", "autodiff"}:
            fix = ("drop the user's reduction: autodiff already sums the gradient of a "
                   f"parameter replicated over {a!r} (the transpose of its implicit pvary)")
        elif max(c.unit_bytes for c in grads) > max(params):
            fix = (f"reduce the gradient at its parameter's size: pvary the shard over {a!r} "
                   "before gathering it (the all-reduce then runs on the shard)")
        else:
            fix = (f"a parameter used several times is reduced once per use: make it Varying "
                   f"once, jax.lax.pcast(w, {a!r}, to='varying'), before its uses, and reduce "
                   "its gradient once")
        out.append(Flag(
            "SPMD705", worst.where,
            f"gradient all-reduce over {a!r}: {_fmt(sent)} per step for {_fmt(ideal)} of "
            f"parameters ({sent / ideal:.2f}x the ideal 2(n-1)/n x parameter bytes = "
            f"{_fmt(2 * (g - 1) / g * ideal)} on the wire per device, n={g}; "
            f"{len(grads)} reduction{'s' if len(grads) > 1 else ''})", fix, (a,)))
    return out


def all_flags(cols: Sequence[Collective], compiled: Sequence[CompiledOp],
              shard_maps: Sequence[Any], parents: dict[int, tuple[Any, Any]] | None = None
              ) -> list[Flag]:
    try:
        return [*in_loop(cols), *of_invariant(cols), *gather_into_opaque(cols, compiled),
                *psum_then_slice(cols), *gradient_volume(cols, shard_maps, parents)]
    finally:
        _INDEX.clear()

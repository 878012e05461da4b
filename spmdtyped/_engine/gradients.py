"""Gradients read from the jaxpr (issue 27, item 2): which values of a shard_map body are the
gradients its own `jax.grad` / `jax.value_and_grad` / `jax.vjp` (or any library's:
`eqx.filter_value_and_grad`, `nnx.value_and_grad`, optax inside the step) computed, and of
which primal each may be the cotangent. Nothing is routed or patched while the body traces:
JAX names the equations it generates (`jvp` in the name stack of a gradient's forward pass,
`transpose` in its backward pass), and a transposed equation keeps the source line of the
forward equation it transposes.

- **The cotangent of a primal** (`read`): a value that a backward equation defines
  and that an equation outside the backward pass uses (or the jaxpr returns) is a gradient.
  The backward equation that defines it (or, through the `add_any` that sums the
  contributions of several uses, each one that does) transposes a forward equation at the
  same line; the primals are the values that forward equations at that line take from outside
  the forward pass with the gradient's shape and dtype. The refinement walk types the gradient
  by the cotangent rule of their refinement when they all have the same one, and leaves it
  to the rules otherwise (never a new false error).
- **A per-example gradient summed over the devices** (`per_example_sum`): the psum JAX
  inserts as the transpose of an implicit pvary (`psum_invariant`), under a `jax.vmap` that
  batches the forward pass as well: `jax.vmap(jax.grad(f))` of a per-device loss with respect
  to a parameter Invariant there (SPMD407, jax#36886). `jax.jacrev` / `jax.hessian` vmap
  the pullback only (over the cotangent basis): their forward pass is not under the vmap.

Out of reach (docs/refinement.md, "How the gradients are read"): a gradient whose primal
is used at one line together with another value of the same shape and dtype but another
refinement is typed by the transposed equations' rules only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _compat
from .._rules.refine import NONE, Refinement
from .._rules.refine import shape as _rs
from .eqns import EqnView
from .refine_facts import Side, is_literal, var_type

#: the `add_any` that sums the cotangent contributions of a value used several times
_ACCUMULATE = "add_any"
#: the name-stack transformations of a gradient's backward and forward passes
_BACKWARD, _FORWARD = "transpose", "jvp"


def is_backward(eqn: Any) -> bool:
    """Whether `eqn` belongs to a gradient's backward pass (a transposed equation)."""
    return _BACKWARD in _compat.eqn_transforms(eqn)


def is_forward(view: EqnView) -> bool:
    """Whether the equation of `view` belongs to a gradient's forward pass."""
    return _FORWARD in view.transforms


#: the scope JAX gives the forward equations `jax.checkpoint` recomputes in the backward pass
_RECOMPUTED = "rematted_computation"


def is_recomputed(view: EqnView) -> bool:
    """Whether the equation of `view` is a forward one that `jax.checkpoint` recomputes in the
    backward pass (a primal value there, not a cotangent)."""
    return _RECOMPUTED in str(getattr(view.eqn.source_info, "name_stack", ""))


def shape_key(v: Any) -> tuple[Any, ...]:
    """What a gradient and its primal share: shape and dtype."""
    aval = getattr(v, "aval", None)
    return getattr(aval, "shape", ()), getattr(aval, "dtype", None)


@dataclasses.dataclass(frozen=True)
class Gradients:
    """What one jaxpr's own autodiff computed (`read`)."""

    #: each gradient -> the primal values it may be the cotangent of
    links: dict[Any, tuple[Any, ...]]
    #: the transformations around the forward passes traced under a `jax.vmap`
    #: (`("vmap",)`): a backward pass under the same ones is per example
    batched: frozenset[tuple[str, ...]]
    #: the view of each equation that defines gradients of `links` -> those results, in
    #: order (what the refinement walk types after the equation, without testing every
    #: equation's results)
    at: dict[Any, tuple[Any, ...]] = dataclasses.field(default_factory=dict)


def read(views: Sequence[EqnView], outvars: Sequence[Any]) -> Gradients:
    """The gradients computed by the equations of a jaxpr (their views, `eqns.Views.all`)
    returning `outvars` (see the module docstring)."""
    batched: set[tuple[str, ...]] = set()
    forward_defined: set[Any] = set()
    primals_at: dict[tuple[Any, ...], list[Any]] = {}
    producer: dict[Any, EqnView] = {}
    used_outside: set[Any] = {v for v in outvars if not is_literal(v)}
    for view in views:
        t = view.transforms
        eqn = view.eqn
        if _BACKWARD in t:   # (`is_backward`, on the transformations read once)
            for v in eqn.outvars:
                producer[v] = view
            continue
        lits = view.lits
        ins = [v for v, lit in zip(eqn.invars, lits, strict=True) if not lit] \
            if True in lits else eqn.invars
        if producer:
            for v in ins:
                if v in producer:
                    used_outside.add(v)
        if _FORWARD in t:   # a forward equation of a gradient
            if "vmap" in t[:t.index(_FORWARD)]:
                batched.add(t[:t.index(_FORWARD)])
            line = view.user
            if line is not None:
                for v in ins:
                    if v not in forward_defined and v not in producer:
                        primals_at.setdefault((line, *shape_key(v)), []).append(v)
            forward_defined.update(eqn.outvars)
    if not primals_at:
        return Gradients({}, frozenset(batched))

    shared: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    links = {}
    for v in used_outside:
        got = _primals(v, producer, primals_at, shared)
        if got:
            links[v] = got
    at = {view: tuple(o for o in view.eqn.outvars if o in links)
          for view in {producer[v] for v in links}}
    return Gradients(links, frozenset(batched), at)


def _primals(v: Any, producer: dict[Any, EqnView],
             primals_at: dict[tuple[Any, ...], list[Any]],
             shared: dict[tuple[Any, ...], tuple[Any, ...]], depth: int = 0
             ) -> tuple[Any, ...] | None:
    """The primals the gradient `v` may be the cotangent of (`read`): through the `add_any`
    that sums several uses' contributions, the values forward equations at the line of the
    backward equation that defines it take with its shape and dtype. (A module function: a
    recursive closure would be a reference cycle holding the check's views until the next
    collection.)"""
    view = producer.get(v)
    if view is None or depth > 64:
        return None
    if view.name == _ACCUMULATE:
        found: dict[Any, None] = {}
        for u in view.eqn.invars:
            got = None if is_literal(u) else _primals(u, producer, primals_at, shared, depth + 1)
            if got is None:
                return None
            found.update(dict.fromkeys(got))
        return tuple(found)
    line = view.user
    key = (line, *shape_key(v))
    if line is None or key not in primals_at:
        return None
    if key not in shared:   # one tuple per line and key: `type_gradient` memoizes on it
        shared[key] = tuple(dict.fromkeys(primals_at[key]))
    return shared[key]


def type_gradient(v: Any, primals: Sequence[Any], env: dict[Any, Refinement], side: Side,
                  memo: dict[int, tuple[Any, Refinement | None]] | None = None) -> None:
    """Type `v`, a gradient of one of `primals` (`read`), in the refinement walk's `env` by the
    cotangent rule, when they all have the same refinement (else the rules' typing stands).
    `memo` (one per walk of a jaxpr) keeps that refinement per tuple of primals once all of
    them are walked (a line in a loop over layers has a primal per layer, shared by the
    gradient of each: compared once, not once per gradient). In a `check_vma=False` program
    (`side.types` set) a gradient is plain: JAX's autodiff sums nothing there, and what it
    leaves unsummed or partial is the unchecked walk's (SPMD410-SPMD412)."""
    if side.types is not None:
        env[v] = NONE.with_data(True)
        return
    hit = memo.get(id(primals)) if memo is not None else None
    if hit is not None and hit[0] is primals:
        same = hit[1]
    else:
        refs = [env.get(p, NONE) for p in primals]
        same = None if any(r != refs[0] for r in refs[1:]) else refs[0]
        if memo is not None and all(p in env for p in primals):
            memo[id(primals)] = (primals, same)
    if same is None:
        return
    env[v] = _rs.cotangent(same).restrict(var_type(v, side.types).varying).with_data(True)
    side.mark_grad(v)


def per_example_sum(view: EqnView, gradients: Gradients) -> bool:
    """Whether the equation `view` is the psum JAX inserts, as the transpose of an implicit
    pvary, into a gradient traced under a `jax.vmap` of its forward pass too (a per-example
    gradient summed over the devices)."""
    if view.name != "psum_invariant":
        return False
    t = view.transforms
    return _BACKWARD in t and t[:t.index(_BACKWARD)] in gradients.batched

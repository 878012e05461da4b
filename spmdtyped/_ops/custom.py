"""Custom typed ops: `st.custom_op` declares how a function changes states; `st.opaque` wraps an
undeclared one.

For custom collectives, Pallas/FFI kernels and callbacks, whose effect on the manual-axis
states JAX cannot see (or sees wrongly). The wrapped function receives and returns raw JAX
values; spmdtyped checks the inputs against `requires`, computes the result state with
`_rules.custom_op_type` (the union of the inputs' states, Unreduced only where declared, then
the `produces` overrides) and brings JAX's result to that state with free casts
(`_rules.free_casts(..., reinterpret=True)`, identity in the compiled program). A result JAX
types as more varying than declared cannot be cast and raises SPMD902.

A custom kernel's backward is made right too (jax-finufft#226): every input Invariant on an
axis another input varies on (and not pinned there by `requires`) is cast to Varying before
the kernel, so its cotangent is reduced by the cast's transpose (a psum) instead of being a
per-device partial taken for the finished gradient; and a `jax.custom_vjp` kernel is
re-wrapped so that its outputs are Varying on the join of the inputs' varying axes and its
cotangents have their primals' states (an opaque callback or FFI call types both Invariant,
which JAX rejects for a Varying primal). The casts are identities in the compiled program.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat, _rules, _validate
from .._errors import error
from .._rules import SpmdType, State
from .._typed.array import checked, is_typed, typeof, unwrap
from . import collectives as _collectives

Requires = Mapping[str, Any]
Produces = Mapping[str, Any] | Callable[..., Any]


def _is_array_leaf(x: Any) -> bool:
    return is_typed(x) or isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray))


class CustomOp:
    """A function with declared state effects (made by `st.custom_op` / `st.opaque`)."""

    def __init__(self, fn: Callable[..., Any], requires: Requires | None,
                 produces: Produces | None, name: str | None, *, kind: str = "st.custom_op") -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "custom_op")
        self.op = f"{kind}({self.name})"
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None
        self.per_param: dict[str, dict[str, State]] | None = None
        self.all_args: dict[str, State] = {}
        if requires is not None and not isinstance(requires, Mapping):
            raise error("SPMD507", f"{self.op}: requires must be a mapping {{axis: state}} or "
                        f"{{parameter: {{axis: state}}}}, not {type(requires).__name__} "
                        f"{requires!r}", op=self.op,
                        fix="requires={'dp': 'varying'}")
        if produces is not None and not callable(produces) and not isinstance(produces, Mapping):
            raise error("SPMD507", f"{self.op}: produces must be a mapping {{axis: state}} or a "
                        f"function of the arguments' SpmdTypes, not {type(produces).__name__} "
                        f"{produces!r}", op=self.op, fix="produces={'dp': 'invariant'}")
        if requires:
            values = list(requires.values())
            if all(isinstance(v, Mapping) for v in values):
                params = set(self.signature.parameters) if self.signature else None
                self.per_param = {}
                for p, decl in requires.items():
                    if params is not None and p not in params:
                        raise error("SPMD507", f"{self.op}: requires names parameter {p!r}, which "
                                    f"{self.name} does not have (parameters: {sorted(params)})",
                                    op=self.op)
                    self.per_param[p] = _rules.parse_states(decl, op=self.op,
                                                            what=f"requires[{p!r}]")
            elif any(isinstance(v, Mapping) for v in values):
                raise error("SPMD507", f"{self.op}: requires mixes {{axis: state}} and "
                            f"{{parameter: {{axis: state}}}} entries", op=self.op)
            else:
                self.all_args = _rules.parse_states(requires, op=self.op, what="requires")
        self.produces_fn: Callable[..., Any] | None = None
        self.produces: dict[str, State] | None = None
        if callable(produces):
            self.produces_fn = produces
        elif produces is not None:
            self.produces = _rules.parse_states(produces, op=self.op, what="produces")

    def _declared_axes(self) -> list[str]:
        axes = list(self.all_args)
        for decl in (self.per_param or {}).values():
            axes.extend(decl)
        axes.extend(self.produces or {})
        return axes

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        op = self.op
        mesh_axes, manual = _compat.current_mesh()
        if not manual:
            # outside shard_map there are no manual axes: no state to require or produce; the
            # function runs as itself (as a jax.lax collective would not, but a kernel does)
            raw_out = self.fn(*(unwrap(a) for a in args), **{k: unwrap(v) for k, v in kwargs.items()})
            return jax.tree_util.tree_map(lambda r: checked(op, r, typeof(r)), raw_out)
        _rules.check_axes_known(tuple(dict.fromkeys(self._declared_axes())), op, manual, mesh_axes)
        # one (leaf, requirement, name) per array leaf of the arguments
        leaves: list[Any] = []
        reqs: list[dict[str, State]] = []
        names: list[str] = []
        if self.per_param is not None and self.signature is not None:
            bound = self.signature.bind(*args, **kwargs)
            groups: Sequence[tuple[str, Any]] = list(bound.arguments.items())
        else:
            groups = [(f"argument {k}", a) for k, a in enumerate(args)] + list(kwargs.items())
        for pname, value in groups:
            with_path = jax.tree_util.tree_flatten_with_path(value, is_leaf=is_typed)[0]
            for path, leaf in with_path:
                if not _is_array_leaf(leaf):
                    continue
                leaves.append(leaf)
                names.append(f"{pname}{jax.tree_util.keystr(path)}")
                reqs.append((self.per_param or {}).get(pname, {}) if self.per_param is not None
                            else self.all_args)
        in_types = [typeof(x) for x in leaves]
        out_t = _rules.custom_op_type(in_types, reqs, self.produces, op=op, names=names)
        if manual:
            args, kwargs = self._vary_inputs(args, kwargs, leaves, in_types, reqs)
        raw_args = tuple(unwrap(a) for a in args)
        raw_kwargs = {k: unwrap(v) for k, v in kwargs.items()}
        rules = _compat.custom_vjp_rules(self.fn) if manual and not kwargs else None
        if rules is not None:
            out_axes = out_t.varying if self.produces is None and self.produces_fn is None \
                else frozenset()
            raw_out = _cast_rules(*rules, out_axes)(*raw_args)
        else:
            raw_out = self.fn(*raw_args, **raw_kwargs)
        out_leaves, out_def_ = jax.tree_util.tree_flatten(raw_out, is_leaf=is_typed)
        out_def: Any = out_def_
        if self.produces_fn is not None:
            arg_types = [jax.tree_util.tree_map(typeof, a, is_leaf=is_typed) for a in args]
            declared = self.produces_fn(*arg_types)
            wants = ([declared] * len(out_leaves) if isinstance(declared, SpmdType)
                     else jax.tree_util.tree_leaves(declared))
            if len(wants) != len(out_leaves) or not all(isinstance(w, SpmdType) for w in wants):
                raise error("SPMD507", f"{op}: produces(...) must return an SpmdType or one per "
                            f"output ({len(out_leaves)}), got {declared!r}", op=op)
        else:
            wants = [out_t] * len(out_leaves)
        return out_def.unflatten([self._fit(unwrap(r), w) for r, w in zip(out_leaves, wants, strict=True)])

    def _vary_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any],
                     in_types: list[SpmdType], reqs: list[dict[str, State]]
                     ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Each input Invariant on an axis another input varies on (and that its `requires` does
        not pin) cast to Varying there before the kernel. The kernel then sees one state on
        that axis, and the cotangent of the replicated input is reduced by the cast's transpose
        (a psum) instead of being taken, per device, for the finished gradient
        (jax-finufft#226)."""
        union = frozenset().union(*(t.varying for t in in_types)) if in_types else frozenset()
        cast: dict[int, Any] = {}
        for leaf, t, req in zip(leaves, in_types, reqs, strict=True):
            widen = tuple(sorted(a for a in union if t.state(a) is State.INVARIANT and a not in req))
            if widen and id(leaf) not in cast:
                cast[id(leaf)] = _collectives.pcast(leaf, widen if len(widen) > 1 else widen[0],
                                                    to="varying")
        if not cast:
            return args, kwargs

        def swap(x: Any) -> Any:
            return cast.get(id(x), x)

        return (jax.tree_util.tree_map(swap, args, is_leaf=is_typed),
                jax.tree_util.tree_map(swap, kwargs, is_leaf=is_typed))

    def _fit(self, raw: Any, want: SpmdType) -> Any:
        if not isinstance(raw, (jax.Array, jax.core.Tracer)):
            return raw
        have = typeof(raw)
        if have == want:
            return checked(self.op, raw, want)
        steps = _rules.free_casts(have, want, reinterpret=True)
        if steps is None:
            bad = sorted(a for a in have.axes | want.axes if have.state(a) is not want.state(a))
            a = bad[0]
            raise error("SPMD902", f"{self.op}: JAX types the result {have.state(a).title} over "
                        f"{a!r}, but the declaration says {want.state(a).title}; no free cast "
                        f"goes from {have.state(a).title} to {want.state(a).title}", axes=bad,
                        states=have.states(bad), op=self.op,
                        details=(f"result: {have}", f"declared: {want}"),
                        fix=f"produces={{{a!r}: {have.state(a).value!r}}}, or build the result "
                            f"in the declared state")
        x: Any = raw
        for target, axes in steps:
            x = _collectives.pcast(x, axes if len(axes) > 1 else axes[0], to=target)
        return checked(self.op, unwrap(x), want)

    def __repr__(self) -> str:
        return f"<st.custom_op {self.name}>"


def _vary_to(x: Any, axes: frozenset[str]) -> Any:
    """A raw value cast (pvary) to Varying on the axes of `axes` it is Invariant on."""
    if x is None or not isinstance(x, (jax.Array, jax.core.Tracer)):
        return x
    t = typeof(x)
    missing = tuple(sorted(a for a in axes if a not in t.axes))
    if not missing:
        return x
    return _compat.pcast(x, missing if len(missing) > 1 else missing[0], to="varying")


def _cast_rules(fun: Callable[..., Any], fwd: Callable[..., Any], bwd: Callable[..., Any],
                out_axes: frozenset[str]) -> Callable[..., Any]:
    """A `jax.custom_vjp` kernel re-wrapped so that its outputs are Varying on `out_axes` (the
    join of the inputs' varying axes) and its cotangents have their primals' states.

    An opaque kernel (a callback, an FFI call) types its results Invariant whatever its inputs
    vary on; its backward then returns cotangents less varying than the primals it was given,
    which JAX rejects, or (once cast by hand to pass that check) takes per-device partial
    cotangents for finished gradients. The casts are identities in the compiled program.
    """
    def cast_tree(tree: Any, axes: Sequence[frozenset[str]] | frozenset[str]) -> Any:
        leaves, tdef = jax.tree_util.tree_flatten(tree)
        per = axes if isinstance(axes, (list, tuple)) else [axes] * len(leaves)
        return tdef.unflatten([_vary_to(x, a) for x, a in zip(leaves, per, strict=True)])

    def call(*primals: Any) -> Any:
        in_axes = [[typeof(x).varying if isinstance(x, (jax.Array, jax.core.Tracer)) else
                    frozenset() for x in jax.tree_util.tree_leaves(p)] for p in primals]

        @jax.custom_vjp
        def wrapped(*a: Any) -> Any:
            return cast_tree(fun(*a), out_axes)

        def wrapped_fwd(*a: Any) -> Any:
            out, res = fwd(*a)
            return cast_tree(out, out_axes), res

        def wrapped_bwd(res: Any, ct: Any) -> Any:
            cts = bwd(res, ct)
            return tuple(c if c is None else cast_tree(c, axes)
                         for c, axes in zip(cts, in_axes, strict=True))

        wrapped.defvjp(wrapped_fwd, wrapped_bwd)
        return wrapped(*primals)

    return call


def custom_op(fn: Callable[..., Any] | None = None, /, *, requires: Requires | None = None,
              produces: Produces | None = None, name: str | None = None) -> Any:
    """Declare how a function changes manual-axis states (decorator).

    For custom collectives, Pallas/FFI kernels and callbacks. The function receives raw JAX
    values and returns raw JAX values (or pytrees); the wrapper accepts typed or raw values and
    returns typed ones.

    **Arguments:**

    - `fn`: the function (omit to use `custom_op(...)` as a decorator factory).
    - `requires`: `{axis: state}`, the state every array argument must have on each axis, or
      `{parameter: {axis: state}}` per parameter. States: `"invariant"`, `"varying"`,
      `"unreduced"`, `"reduced"` (or `st.State`). Declaring `"unreduced"` on an axis says the
      op is linear in those partial sums; undeclared Unreduced inputs are rejected (SPMD202).
    - `produces`: `{axis: state}` overriding the result's state on those axes (the rest is the
      union of the inputs' states), or a function of the arguments' `SpmdType`s returning an
      `SpmdType` (for every output) or one per output leaf.
    - `name`: the name used in messages (default: the function's).

    **Returns:** a `CustomOp` callable.

    **Raises:** (when called) `AxisStateError` SPMD107 for an argument in the wrong state,
    `CombineError` SPMD202 for an undeclared Unreduced argument, `InternalConsistencyError`
    SPMD902 when JAX types the result more varying than declared; `UsageError` SPMD507 for a
    malformed declaration.

    !!! Example
        ```python
        @st.custom_op(requires={"tp": "varying"}, produces={"tp": "invariant"})
        def ring_allreduce(x):                 # a hand-written all-reduce on raw values
            ...
        y = ring_allreduce(x)                  # Varying["dp", "tp"] -> Varying["dp"]
        ```
    """
    if fn is None:
        return functools.partial(custom_op, requires=requires, produces=produces, name=name)
    _validate.callable_arg(fn, "st.custom_op")
    return CustomOp(fn, requires, produces, name)


def opaque(fn: Callable[..., Any], /, *, name: str | None = None) -> CustomOp:
    """Wrap an undeclared function: its results get the union of its inputs' states.

    Unreduced inputs are rejected (the function is not known to be linear: SPMD202). If JAX
    types a result more varying than that union (the function varies by itself, e.g. it uses
    `axis_index`), declare it with `st.custom_op(produces=...)` instead (SPMD902).

    **Arguments:** `fn` on raw JAX values; `name` for messages.

    **Returns:** a `CustomOp` taking typed or raw values and returning typed ones.

    !!! Example
        ```python
        y = st.opaque(my_pallas_kernel)(x, w)   # x: Varying["dp"], w: Invariant -> Varying["dp"]
        ```
    """
    _validate.callable_arg(fn, "st.opaque")
    return CustomOp(fn, None, None, name or getattr(fn, "__name__", "opaque"), kind="st.opaque")


__all__ = ["CustomOp", "custom_op", "opaque"]

"""The states a raw shard_map program's own functions see, observed while JAX traces it.

`port` annotates more than the function handed to `jax.shard_map`: the nested loss function
given to `jax.value_and_grad`, the `fori_loop` / `scan` body, the `@jax.jit` or
`@jax.checkpoint` helper. Their parameters' states are not written anywhere in the source;
they are what JAX computes while it traces the program. `observe` traces the raw function
under `jax.shard_map` (as `infer` does: abstract arguments, `check_vma=True`) with a profile
hook that records, for every call of a function defined in the program's file while the
per-shard body runs, the state of each argument and of the returned value
(`_compat.typeof_raw_or_none`), rendered as annotation text by `_rules.hint_text` (pytrees:
`tuple[...]`, `list[...]` / `dict[str, ...]` when uniform, a module-level NamedTuple class by
name). A function called with different states at different calls gets no annotation for that
parameter (`None`). A program JAX rejects is observed up to the failing line.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec

from ... import _compat, _rules
from ..._boundary.shard_map import is_spec_leaf
from .._conventions import fn_name, made_current, manual_axes, resolve_in_specs, resolve_mesh
from .._infer import abstract_args

#: a parameter seen with different states (no single annotation fits)
CONFLICT = "<conflict>"


@dataclasses.dataclass
class Observed:
    """What one function of the program saw: `params` maps each parameter name to its
    annotation text (None: not an array or pytree of arrays; `CONFLICT`: different states
    at different calls); `ret` the returned value's annotation (None: unknown)."""

    name: str
    line: int
    params: dict[str, str | None] = dataclasses.field(default_factory=dict)
    ret: str | None = None
    returned: bool = False

    def merge_param(self, name: str, hint: str | None) -> None:
        if name not in self.params:
            self.params[name] = hint
        elif self.params[name] != hint:
            self.params[name] = CONFLICT

    def merge_ret(self, hint: str | None) -> None:
        if not self.returned:
            self.ret, self.returned = hint, True
        elif self.ret != hint:
            self.ret = CONFLICT


def tree_hint(value: Any, order: Sequence[str], file: str | None,
              leaf_type: Callable[[Any], _rules.SpmdType | None] | None = None) -> str | None:
    """The annotation text of a value inside shard_map: a JAX value's state, or a pytree of
    them; None when it has no expressible annotation."""
    get = leaf_type or _compat.typeof_raw_or_none
    if leaf_type is not None:
        t = leaf_type(value)
        if t is not None:
            return _rules.hint_text(t, order)
    if isinstance(value, (bool, int, float, complex, str, type(None))) or callable(value):
        return None
    fields = getattr(type(value), "_fields", None)
    if isinstance(value, tuple) and fields is not None:
        parts = [tree_hint(v, order, file, leaf_type) for v in value]
        cls = type(value)
        mod = sys.modules.get(cls.__module__)
        if None in parts or "<locals>" in cls.__qualname__ or \
                getattr(mod, "__file__", None) != file:
            return None
        return cls.__qualname__
    if isinstance(value, tuple):
        # `None` in a tuple (a scan body's `return carry, None`) is written as such
        parts = ["None" if v is None else tree_hint(v, order, file, leaf_type) for v in value]
        return None if None in parts or not parts else f"tuple[{', '.join(parts)}]"  # type: ignore[arg-type]
    if isinstance(value, list):
        kinds = {tree_hint(v, order, file, leaf_type) for v in value}
        return f"list[{kinds.pop()}]" if len(kinds) == 1 and None not in kinds else None
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return None
        kinds = {tree_hint(v, order, file, leaf_type) for v in value.values()}
        return f"dict[str, {kinds.pop()}]" if len(kinds) == 1 and None not in kinds else None
    try:
        t = get(value)
    except Exception:  # noqa: BLE001 - not a JAX value
        return None
    return None if t is None else _rules.hint_text(t, order)


def _param_names(code: Any) -> list[str]:
    n = code.co_argcount + code.co_kwonlyargcount
    return [v for v in code.co_varnames[:n] if v not in ("self", "cls")]


def observe(f: Callable[..., Any], *args: Any, file: str, out_specs: Any,
            in_specs: Any = _compat.INFER, mesh: Any = None,
            axis_names: Any = frozenset()) -> tuple[dict[tuple[str, int], Observed], str | None]:
    """Trace `jax.shard_map(f, ...)` on abstract `args` and record the states the functions
    defined in `file` see.

    **Returns:** `(observed, out_hint)`: `observed` maps `(function name, first line)` (the
    line of its first decorator, or of its `def`) to an `Observed`; `out_hint` is the
    annotation `out_specs` declares for `f`'s result (the output's structure, each leaf the
    state its out_spec gives), None when it cannot be written.
    """
    mesh = resolve_mesh(mesh, f"port({getattr(f, '__name__', 'f')})", concrete=True)
    in_specs = resolve_in_specs(in_specs, tuple(args))
    order = _compat.mesh_axis_names(mesh)
    manual = manual_axes(mesh, axis_names)
    sds = abstract_args(args, in_specs, mesh)
    seen: dict[tuple[str, int], Observed] = {}
    returned: list[Any] = []
    inside = [False]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if not inside[0] or frame.f_code.co_filename != file:
            return
        code = frame.f_code
        if code.co_name.startswith("<"):  # lambdas, comprehensions: not annotatable
            return
        key = (code.co_name, code.co_firstlineno)
        obs = seen.setdefault(key, Observed(code.co_name, code.co_firstlineno))
        if event == "call":
            for name in _param_names(code):
                obs.merge_param(name, tree_hint(frame.f_locals.get(name), order, file))
        elif event == "return" and arg is not None:
            obs.merge_ret(tree_hint(arg, order, file))
            # a parameter the body rebinds to a value of another state (`y = pcast(y, ...)`,
            # `x = psum(x, ...)`): its annotation would refuse that assignment under mypy, so
            # it is a conflict (left unannotated); rebound in the same state, it stays
            local = frame.f_locals
            for name in _param_names(code):
                if name in local and name in obs.params:
                    obs.merge_param(name, tree_hint(local[name], order, file))

    def body(*a: Any) -> Any:
        inside[0] = True
        old = sys.getprofile()
        sys.setprofile(profile)
        try:
            out = f(*a)
        finally:
            sys.setprofile(old)
            inside[0] = False
        returned.append(out)
        return out

    smapped = _compat.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                axis_names=axis_names, check_vma=True)
    try:
        with made_current(mesh):   # the call's own mesh, whatever the module set since
            jax.make_jaxpr(smapped)(*sds)
    except Exception:  # noqa: BLE001, S110 - a buggy program: observed up to the failure
        pass
    return seen, _declared(out_specs, returned[0] if returned else None, order, manual, file)


def _declared(out_specs: Any, out: Any, order: Sequence[str], manual: Sequence[str],
              file: str) -> str | None:
    """The result annotation out_specs declare: `out`'s structure (or the specs' own, when
    the function failed), each leaf the state of its out_spec."""
    def spec_type(spec: Any) -> _rules.SpmdType:
        part, un, red, kind = _compat.spec_parts(spec if spec is not None else PartitionSpec())
        return _rules.in_spec_type(part, un, red, manual, kind)

    if out is None:
        return tree_hint(out_specs, order, file,
                         leaf_type=lambda s: spec_type(s) if isinstance(s, PartitionSpec) else None)
    try:
        typed = jax.tree_util.tree_map(
            lambda spec, sub: jax.tree_util.tree_map(lambda _: spec_type(spec), sub),
            out_specs, out, is_leaf=is_spec_leaf)
    except (ValueError, TypeError):
        return None
    return tree_hint(typed, order, file, leaf_type=lambda t: t if isinstance(t, _rules.SpmdType) else None)


def observe_all(runs: Sequence[tuple[Any, ...]], *, file: str,
                mesh: Any = None) -> tuple[dict[tuple[str, int], Observed], dict[str, str]]:
    """`observe` over several entry points of one file (the shard_map'd function and its
    variants), merged: `runs` is `(f, args, in_specs, out_specs)` per entry point, or
    `(f, args, in_specs, out_specs, mesh)` for one traced on a mesh of its own.

    **Returns:** `(states, declared)` for `_codemod.port_source`: the merged observations
    (a parameter seen with different states is `CONFLICT`) and, per entry function name, the
    result annotation its out_specs declare (left out where two entry points of the same name
    disagree)."""
    states: dict[tuple[str, int], Observed] = {}
    declared: dict[str, str | None] = {}
    for f, args, in_specs, out_specs, *own in runs:
        seen, out = observe(f, *args, file=file, mesh=own[0] if own else mesh,
                            in_specs=in_specs, out_specs=out_specs)
        for key, obs in seen.items():
            if key not in states:
                states[key] = obs
                continue
            for p, h in obs.params.items():
                states[key].merge_param(p, h)
            if obs.returned:
                states[key].merge_ret(obs.ret)
        name = fn_name(f)
        declared[name] = out if declared.get(name, out) == out else None
    return states, {k: v for k, v in declared.items() if v is not None}

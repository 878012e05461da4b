"""What a pytree argument's class says about its fields: their names (dataclass, `eqx.Module`,
NamedTuple), their resolved hints, and the state hint each stands for.

Read by `st.shard_map` (checking the fields of arguments against their hints, SPMD403) and by
`specs` (deriving a spec per leaf from the field hints); imports neither of them.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from typing import Any

from .._typed.hints import hint_type, is_state_class

#: class -> its resolved field hints (read once per class)
_FIELD_HINTS: dict[type, dict[str, Any]] = {}


def field_hints(cls: type) -> dict[str, Any]:
    """The field hints of a dataclass / `eqx.Module` / NamedTuple class, resolved. When one
    annotation cannot be resolved (a forward reference to a name not in scope), the others
    still are; the unresolvable ones are left out."""
    hints = _FIELD_HINTS.get(cls)
    if hints is None:
        hints = _FIELD_HINTS[cls] = _resolve_field_hints(cls)
    return hints


def evaluated(annotations: dict[str, Any], globalns: dict[str, Any],
               localns: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """Each annotation on its own (a string evaluated in `globalns` / `localns`): the ones
    that resolve, and the names of those that do not (a forward reference out of scope)."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    for name, ann in annotations.items():
        try:
            out[name] = eval(ann, globalns, localns) if isinstance(ann, str) else ann  # noqa: S307
        except Exception:  # noqa: BLE001
            missing.append(name)
    return out, missing


def _resolve_field_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - one unresolvable annotation: resolve field by field
        pass
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        resolved, missing = evaluated(vars(klass).get("__annotations__", {}),
                                       dict(vars(module)) if module is not None else {},
                                       dict(vars(klass)))
        out.update(resolved)
        for name in missing:  # a name not in scope: no hint for this field
            out.pop(name, None)
    return out


def field_names(value: Any) -> list[str] | None:
    """The field names of a dataclass / `eqx.Module` / NamedTuple instance; None for any other
    value (a class, a plain tuple)."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return list(value._fields)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [f.name for f in dataclasses.fields(value)]
    return None


def state_hint(hint: Any) -> type | None:
    """The state hint class a field hint stands for (`Varying["tp"]`, `Shard["tp", -1]`, the
    state of `st.Float[Varying["dp"], "b/dp d"]`), or None for any other hint."""
    hint = strip(hint)
    if hasattr(hint, "_axes") and hasattr(hint, "_state"):  # st.Float[...] (_jaxtyping)
        hint = hint._state
    return hint if is_state_class(hint) and hint_type(hint) is not None else None


def strip(hint: Any) -> Any:
    """`Annotated[T, ...]` -> `T`."""
    if typing.get_origin(hint) is typing.Annotated:
        return typing.get_args(hint)[0]
    return hint

"""`return`: a value whose state does not fit the function's return hint is reported under the
runtime's out-boundary code (`_rules.check_return`, SPMD401 `spmd-out-spec-state`, the rule
`st.shard_map` applies to the value its function returns), with the fix, instead of mypy's
`return-value`.

mypy has no hook on a return statement, and checks function bodies after every decorator
(two-phase checking), so the check cannot run at the `st.shard_map` site either. It runs where
mypy reports the mismatch: an error filter (mypy's `ErrorWatcher` with a filter function, at
the bottom of the error watcher stack) reads the two types of each `return-value` error whose
got and expected types are both state types (`SArray[V, U, R, K]`, as mypy shows them),
replaces the error by the rule's, and leaves every other error alone. mypy's temporary
filters (overload and union inference) sit above it and see the error first. Internal API
(`Errors._watchers`, mypy 1.15-2.x), hence the guards: without it mypy's own error is shown."""

from __future__ import annotations

import re
from typing import Any, Final

from mypy import errorcodes
from mypy.errors import ErrorInfo, Errors, ErrorWatcher

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import SpmdType
from .codes import CODES, SPMD

_GOT: Final = re.compile(r'^Incompatible return value type \(got "(?P<got>.+)", expected "(?P<want>.+)"\)$')
_SARRAY: Final = re.compile(r"^(?:[\w.]+\.)?SArray\[(?P<args>.*)\]$")
_LITERAL: Final = re.compile(r"^Literal\[(?P<items>.*)\]$")
_STR: Final = re.compile(r"'([^']*)'")
_TUPLE: Final = re.compile(r"^tuple\[(?P<items>.*)\]$")
#: the Errors objects with the filter installed (one per build; dmypy keeps its own)
_INSTALLED: dict[int, ErrorWatcher] = {}


def install(errors: Errors | None) -> None:
    """Put the filter at the bottom of `errors`' watcher stack (once per Errors object)."""
    if errors is None:
        return
    try:
        watchers = errors._watchers
        w = _INSTALLED.get(id(errors))
        if w is not None and any(x is w for x in watchers):
            return
        w = ErrorWatcher(errors, filter_errors=lambda file, info: _convert(errors, file, info))
        watchers.insert(0, w)
        _INSTALLED[id(errors)] = w
    except Exception:  # noqa: BLE001 - internal API: mypy reports its own return-value error
        pass


def _axes(text: str) -> frozenset[str] | None:
    """`Never`, `Literal['dp']`, `Literal['dp', 'tp']` or a `|` union of them; None otherwise."""
    out: set[str] = set()
    for part in (p.strip() for p in text.split("|")):
        if part == "Never":
            continue
        m = _LITERAL.match(part)
        if m is None:
            return None
        names = _STR.findall(m.group("items"))
        if not names:
            return None
        out.update(names)
    return frozenset(out)


def _split(args: str) -> list[str]:
    depth, start, out = 0, 0, []
    for i, c in enumerate(args):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(args[start:i].strip())
            start = i + 1
    out.append(args[start:].strip())
    return out


def state_of(text: str) -> SpmdType | None:
    """The state of a state type as mypy shows it (`SArray[Literal['dp'], Never, Never, Any]`)."""
    m = _SARRAY.match(text)
    if m is None:
        return None
    args = _split(m.group("args"))
    if len(args) < 3:
        return None
    slots = [_axes(a) for a in args[:3]]
    if any(s is None for s in slots):
        return None
    v, u, r = (s or frozenset() for s in slots)
    return SpmdType(v, u, r)


def pairs(got: str, want: str) -> list[tuple[SpmdType, SpmdType]] | None:
    """The (value, hint) states of a returned state type, or of each item of a returned tuple
    of them (`tuple[SArray[...], SArray[...]]`); None where a type is not one of those."""
    g, w = _TUPLE.match(got), _TUPLE.match(want)
    if g is not None and w is not None:
        gi, wi = _split(g.group("items")), _split(w.group("items"))
        if len(gi) != len(wi):
            return None
        out: list[tuple[SpmdType, SpmdType]] = []
        for a, b in zip(gi, wi, strict=True):
            sub = pairs(a, b)
            if sub is None:
                return None
            out.extend(sub)
        return out
    have, hint = state_of(got), state_of(want)
    return None if have is None or hint is None else [(have, hint)]


def _convert(errors: Errors, file: str, info: ErrorInfo) -> bool:
    """The filter: True (drop mypy's error) after reporting the rule's in its place."""
    if info.code is not errorcodes.RETURN_VALUE or info.severity != "error":
        return False
    m = _GOT.match(info.message)
    if m is None:
        return False
    states = pairs(m.group("got"), m.group("want"))
    if not states:
        return False
    function = info.local_ctx[1] if info.local_ctx else None
    try:
        for i, (have, want) in enumerate(states):
            item = f" (item {i} of the tuple)" if len(states) > 1 else ""
            _rules.check_return(have, want, where=f"return in {function or 'the function'}{item}")
    except SpmdTypeError as err:
        try:
            code = CODES.get(err.code, SPMD)
            kw: dict[str, Any] = {"end_line": info.end_line, "end_column": info.end_column,
                                  "origin_span": info.origin_span}
            new = errors.report(info.line, info.column, err.headline, code=code, **kw)
            if err.fix:
                errors.report(info.line, info.column, f"fix: {err.fix}", code=code,
                              severity="note", parent_error=new, **kw)
            errors.report(info.line, info.column, f"see: python -m spmdtyped explain {err.code}",
                          code=code, severity="note", parent_error=new, **kw)
        except Exception:  # noqa: BLE001 - internal API: keep mypy's error
            return False
        return True
    return False

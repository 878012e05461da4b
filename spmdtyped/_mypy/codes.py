"""Error codes and reporting: one mypy `ErrorCode` per registry entry (all sub-codes of
`spmd`), an `SpmdTypeError` reported with its runtime headline and fix, and hook guards."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from mypy.errorcodes import ErrorCode
from mypy.nodes import Context
from mypy.plugin import (
    AnalyzeTypeContext,
    AttributeContext,
    FunctionContext,
    FunctionSigContext,
    MethodContext,
    MethodSigContext,
)
from mypy.typeops import make_simplified_union
from mypy.types import AnyType, FunctionLike, Type, TypeOfAny

from .._errors import REGISTRY, SpmdTypeError
from .._rules import SpmdType
from .convert import Known, from_spmd

SPMD: Final = ErrorCode("spmd", "spmdtyped: manual-axis state errors", "spmdtyped")
CODES: Final = {
    code: ErrorCode(entry.mypy_code, entry.title, "spmdtyped", sub_code_of=SPMD)
    for code, entry in REGISTRY.items()
}
#: opt-in (`enable_error_code = spmd-axis`): an axis name the plugin cannot read statically
AXIS: Final = ErrorCode("spmd-axis", "axis name is not a literal: result state unknown", "spmdtyped",
                        default_enabled=False, sub_code_of=SPMD)
#: opt-in (`[spmdtyped] unknown = true`, `enable_error_code = spmd-unknown` or `python -m
#: spmdtyped check --strict`): the first place where a typed value's state is lost (`unknown`).
#: mypy shows it where it is reported; the plugin reports it only where it is turned on.
UNKNOWN: Final = ErrorCode("spmd-unknown", "a typed value's state or refinement is lost from here",
                           "spmdtyped", sub_code_of=SPMD)
#: the opt-in codes besides the registry's (`python -m spmdtyped check --help` lists them)
OPT_IN: Final = (AXIS, UNKNOWN)


#: how many rule errors `report` made (`unknown` reports no lost state where a rule failed)
REPORTED: Final = [0]


def report(api: Any, err: SpmdTypeError, context: Context) -> None:
    """Report a rule-table error with its runtime headline, code `spmd-<slug>` and the fix."""
    REPORTED[0] += 1
    code = CODES.get(err.code, SPMD)
    api.fail(err.headline, context, code=code)
    if err.fix:
        api.msg.note(f"fix: {err.fix}", context, code=code)
    api.msg.note(f"see: python -m spmdtyped explain {err.code}", context, code=code)


def report_past_operator_fallback(api: Any, err: SpmdTypeError, context: Context) -> None:
    """Report from a reflected operator (`2.0 + u`, `__radd__`): mypy tries `float.__add__`
    first and, when both directions report errors, replaces them by its generic `[operator]`
    message. The rule error is the real one, so it is reported past the innermost error
    filter (mypy's per-direction one; internal API, hence the fallback to `report`)."""
    past_operator_fallback(api, lambda: report(api, err, context))


def past_operator_fallback(api: Any, emit: Callable[[], None]) -> None:
    """`emit()` past the innermost error filter (`report_past_operator_fallback`): an error
    inside an operator's method is mypy's cue to try the other direction, and to type the
    expression `Any` when that fails too."""
    try:
        watchers = api.msg.errors._watchers
        top = watchers[-1] if watchers else None
    except Exception:  # noqa: BLE001 - internal API: report normally
        top = None
    if top is None:
        emit()
        return
    watchers.pop()
    try:
        emit()
    finally:
        watchers.append(top)


def apply(api: Any, context: Context, default: Type, alternatives: Sequence[Sequence[Known]],
          rule: Callable[..., SpmdType],
          on_error: Callable[[Any, SpmdTypeError, Context], None] = report) -> Type:
    """Call `rule` on every combination of operand states; union the results (a union
    argument, e.g. a ternary of incompatible states, has several alternatives)."""
    results: list[Type] = []
    for combo in itertools.product(*alternatives):
        try:
            out = rule(*combo)
        except SpmdTypeError as err:
            on_error(api, err, context)
            return default
        results.append(from_spmd(api, out))
    if len(results) == 1:
        return results[0]
    return make_simplified_union(results) if results else default


#: re-raise unexpected exceptions in hooks (the test suite sets it); otherwise a hook that
#: fails falls back to mypy's own type (no precision, no crash of the user's type check)
DEBUG: Final = bool(os.environ.get("SPMDTYPED_PLUGIN_DEBUG"))

_Ctx = TypeVar("_Ctx", FunctionContext, MethodContext, AttributeContext, AnalyzeTypeContext)
_SigCtx = TypeVar("_SigCtx", FunctionSigContext, MethodSigContext)


def guarded(hook: Callable[[_Ctx], Type]) -> Callable[[_Ctx], Type]:
    """`hook`, falling back to mypy's own type when it fails unexpectedly."""

    def guard(ctx: _Ctx) -> Type:
        try:
            return hook(ctx)
        except Exception:
            if DEBUG:
                raise
            if isinstance(ctx, (FunctionContext, MethodContext)):
                return ctx.default_return_type
            if isinstance(ctx, AttributeContext):
                return ctx.default_attr_type
            return AnyType(TypeOfAny.special_form)

    return guard


def guarded_sig(hook: Callable[[_SigCtx], FunctionLike]) -> Callable[[_SigCtx], FunctionLike]:
    """A signature hook, falling back to the default signature when it fails unexpectedly."""

    def guard(ctx: _SigCtx) -> FunctionLike:
        try:
            return hook(ctx)
        except Exception:
            if DEBUG:
                raise
            return ctx.default_signature

    return guard

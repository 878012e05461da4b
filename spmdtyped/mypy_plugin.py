"""The spmdtyped mypy plugin: precise manual-axis states for every hint, collective and operator.

Enable it with `plugins = spmdtyped.mypy_plugin` in the mypy configuration. This module is the
entry point only: it maps full names to the `analyze` of one feature module of
`spmdtyped._mypy` (see its docstring for the module map). Every result comes from the rule
table (`spmdtyped._rules`) with `_rules.CONSERVATIVE` features, or one JAX version's
(`[spmdtyped] jax = 0.12`); an `SpmdTypeError` is reported under its `spmd-<slug>` code with
the fix. Raw `jax.Array` values, `Any` and non-literal axis names give `SArray[Any, Any, Any]`
and no error (the opt-in code `spmd-axis` reports non-literal axes).

The plugin imports no JAX, uses only standard mypy types (the incremental cache and dmypy
work), and reports a digest of the rule table and itself as its configuration data.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from mypy.options import Options
from mypy.plugin import (
    AnalyzeTypeContext,
    AttributeContext,
    FunctionContext,
    FunctionSigContext,
    MethodContext,
    Plugin,
    ReportConfigContext,
)
from mypy.types import FunctionLike, Type

from ._mypy import autodiff, boundary, collectives, control, functions, hints, operators
from ._mypy.codes import AXIS, CODES, SPMD, guarded, guarded_sig
from ._mypy.config import CONFIG, FEATURE_SETS, read_config, rules_digest

__all__ = ["AXIS", "CODES", "FEATURE_SETS", "SPMD", "SpmdPlugin", "plugin", "read_config"]

_DIGEST: Final = rules_digest()


class SpmdPlugin(Plugin):
    """Registers one `analyze` per feature module on the static view's names
    (`spmdtyped._static`, and the runtime modules' names where the checker sees those).

    Configuration (optional), in the mypy config file: `[spmdtyped]` with `jax = 0.12` (or
    `[tool.spmdtyped]` in pyproject.toml) checks with the rules of one JAX version instead of
    `conservative` (what every supported JAX allows, the default).
    """

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        CONFIG.load(options.config_file)

    def get_type_analyze_hook(self, fullname: str) -> Callable[[AnalyzeTypeContext], Type] | None:
        family = hints.FULLNAMES.get(fullname)
        if family is None and "." in fullname and not fullname.startswith(("builtins.", "typing")):
            try:  # `Fam = Varying`: an alias of a hint family
                family = hints.family_of_alias(fullname, self.lookup_fully_qualified)
            except Exception:  # noqa: BLE001 - no module table yet: not an alias we can read
                family = None
        return guarded(functools.partial(hints.analyze, family=family)) if family else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        if fullname in collectives.FULLNAMES:
            return guarded(functools.partial(collectives.analyze, name=collectives.FULLNAMES[fullname]))
        if fullname in functions.FULLNAMES:
            return guarded(functools.partial(functions.analyze, entry=functions.FULLNAMES[fullname]))
        if fullname in operators.FUNCTIONS:
            return guarded(functools.partial(operators.analyze, feature=operators.FUNCTIONS[fullname]))
        if fullname in control.FULLNAMES:
            return guarded(functools.partial(control.analyze, name=control.FULLNAMES[fullname]))
        if fullname in autodiff.FULLNAMES:
            return guarded(functools.partial(autodiff.analyze, name=autodiff.FULLNAMES[fullname]))
        if fullname in boundary.FUNCTIONS:
            return guarded(functools.partial(boundary.analyze, feature="shard_map"))
        return None

    def get_function_signature_hook(self, fullname: str
                                    ) -> Callable[[FunctionSigContext], FunctionLike] | None:
        if fullname in control.FULLNAMES:
            return guarded_sig(functools.partial(control.signature, name=control.FULLNAMES[fullname]))
        return None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        if fullname in operators.METHODS:
            return guarded(functools.partial(operators.analyze, feature=operators.METHODS[fullname]))
        if fullname in boundary.METHODS:
            return guarded(functools.partial(boundary.analyze, feature=boundary.METHODS[fullname]))
        return None

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        if fullname in operators.ATTRIBUTES:
            return guarded(functools.partial(operators.analyze, feature=operators.ATTRIBUTES[fullname]))
        return None

    def report_config_data(self, ctx: ReportConfigContext) -> str | None:
        # The rule table and the JAX rule set are part of every cached result of user code.
        # Installed third-party packages and the standard library do not use spmdtyped: keep
        # their cache entries (JAX's stubs take most of a cold run) across upgrades and settings.
        if not ctx.id.startswith("spmdtyped") and (
                ctx.id.partition(".")[0] in sys.stdlib_module_names
                or any(d in Path(ctx.path).parts for d in ("site-packages", "dist-packages", "typeshed"))):
            return None
        return f"{_DIGEST}:{CONFIG.jax}"


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point (`plugins = spmdtyped.mypy_plugin`)."""
    return SpmdPlugin

"""The spmdtyped mypy plugin: precise manual-axis states for every hint, collective and operator.

Enable it with `plugins = spmdtyped.mypy_plugin` in the mypy configuration. This module is the
entry point only: it maps full names to the `analyze` of one feature module of
`spmdtyped._mypy` (see its docstring for the module map). Every result comes from the rule
table (`spmdtyped._rules`) with `_rules.CONSERVATIVE` features, or one JAX version's
(`[spmdtyped] jax = 0.12`); an `SpmdTypeError` is reported under its `spmd-<slug>` code with
the fix. Raw `jax.Array` values, `Any` and non-literal axis names give `SArray[Any, Any, Any]`
and no error (the opt-in code `spmd-axis` reports non-literal axes, and `spmd-unknown`, with
`[spmdtyped] unknown = true`, where a typed value's state is lost: `_mypy.unknown`).

The plugin imports no JAX, uses only standard mypy types (the incremental cache and dmypy
work), and reports a digest of the rule table and itself as its configuration data.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from mypy.nodes import CallExpr, Decorator, FuncDef, RefExpr, TypeInfo
from mypy.options import Options
from mypy.plugin import (
    AnalyzeTypeContext,
    AttributeContext,
    FunctionContext,
    FunctionSigContext,
    MethodContext,
    MethodSigContext,
    Plugin,
    ReportConfigContext,
)
from mypy.types import CallableType, FunctionLike, Type, get_proper_type

# operators, collectives and hints serve every program; the other feature modules are imported
# on the first name of theirs that mypy asks about (`_feature`, names from `_mypy.names`)
from ._mypy import collectives, hints, names, operators, refined
from ._mypy.codes import AXIS, CODES, SPMD, UNKNOWN, guarded, guarded_sig
from ._mypy.config import CONFIG, FEATURE_SETS, read_config, rules_digest

if TYPE_CHECKING:
    from ._mypy import custom

__all__ = ["AXIS", "CODES", "FEATURE_SETS", "SPMD", "UNKNOWN", "SpmdPlugin", "plugin", "read_config"]

_DIGEST: Final = rules_digest()
#: modules whose functions never take refined parameters (skip the look-up)
_NOT_USER: Final = ("builtins.", "typing.", "jax.", "numpy.", "spmdtyped.", "functools.", "math.",
                    "collections.", "itertools.", "os.", "sys.")


def _feature(name: str) -> Any:
    """The feature module `spmdtyped._mypy.<name>`, imported on first use (`_mypy.names`)."""
    return importlib.import_module(f"{__package__}._mypy.{name}")


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
        # mypy asks for the hooks of every name at every use: the answers of the static name
        # tables are memoised per name (`_table`); user-code look-ups are not (the symbol
        # tables change, e.g. under dmypy)
        self._tables: dict[str, dict[str, Any]] = {}
        #: `spmd-unknown` is on (`_mypy.unknown`): the call and method hooks are watched; read
        #: on the first hook (mypy reads `enable_error_code` after it made the plugin)
        self._unknown_on: bool | None = None

    def _table(self, kind: str, fullname: str, build: Callable[[str], Any]) -> Any:
        """`build(fullname)` (a hook from the static name tables, or None), once per name."""
        memo = self._tables.setdefault(kind, {})
        try:
            return memo[fullname]
        except KeyError:
            hook = memo[fullname] = build(fullname)
            return hook

    @property
    def _unknown(self) -> bool:
        if self._unknown_on is None:
            self._unknown_on = CONFIG.unknown or UNKNOWN in self.options.enabled_error_codes
        return self._unknown_on

    def get_type_analyze_hook(self, fullname: str) -> Callable[[AnalyzeTypeContext], Type] | None:
        hook = self._table("type", fullname, self._type_table)
        if hook is not None or "." not in fullname or fullname.startswith(("builtins.", "typing")):
            return hook  # type: ignore[no-any-return]
        try:  # `Fam = Varying`: an alias of a hint family
            family = hints.family_of_alias(fullname, self.lookup_fully_qualified)
        except Exception:  # noqa: BLE001 - no module table yet: not an alias we can read
            family = None
        return guarded(functools.partial(hints.analyze, family=family)) if family else None

    def _type_table(self, fullname: str) -> Callable[[AnalyzeTypeContext], Type] | None:
        if fullname in hints.ANNOTATED:
            return guarded(hints.annotated)
        family = hints.FULLNAMES.get(fullname)
        return guarded(functools.partial(hints.analyze, family=family)) if family else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        hook = self._function_hook(fullname)
        if self._unknown:  # `spmd-unknown`: every call is watched for a lost state
            watched = _feature("unknown").watch(hook, fullname, self._node)
            return guarded(watched) if watched is not None else None
        return hook

    def _function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        hook = self._table("function", fullname, self._function_table)
        if hook is not None:
            return hook  # type: ignore[no-any-return]
        decl = self._custom_op(fullname)
        if decl is not None:
            return guarded(functools.partial(_feature("custom").analyze_decorated, decl=decl))
        callee = self._refined_callee(fullname)
        if callee is not None:  # a user function with Shard / Partial / Rep parameters
            return guarded(functools.partial(refined.check_call, callee=callee))
        if "." not in fullname and _vmapped():  # `g(w, x)` of a local `g = st.grad(f)`
            return guarded(_feature("autodiff").grad_call)
        defn = self._helper(fullname)
        if defn is not None:  # a user function with parameters of no state: its body re-checked
            return guarded(functools.partial(_feature("calls").check_call, defn=defn))
        return None

    def _helper(self, fullname: str) -> Any:
        """A user function whose parameters say no state (`_mypy.calls`), else None."""
        if fullname.startswith(_NOT_USER) or "." not in fullname:
            return None
        node = self._node(fullname)
        if not isinstance(node, FuncDef):
            return None
        return _feature("calls").definition(node)

    def _helper_method(self, fullname: str) -> Any:
        """A user class's method whose parameters say no state (`_mypy.calls`), else None."""
        if fullname.startswith(_NOT_USER):
            return None
        owner, _, name = fullname.rpartition(".")
        info = self._node(owner) if owner else None
        if not isinstance(info, TypeInfo):
            return None
        return _feature("calls").method(info, name)

    def _function_table(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        collective = collectives.name_of(fullname)
        if collective is not None:
            return guarded(functools.partial(collectives.analyze, name=collective))
        collective = collectives.lax_name_of(fullname)
        if collective is not None:
            return guarded(functools.partial(collectives.analyze, raw=True, name=collective))
        if fullname in collectives.AXIS_SIZE:
            return guarded(collectives.axis_size)
        if fullname in names.FUNCTIONS:
            return guarded(functools.partial(_feature("functions").analyze,
                                             entry=names.FUNCTIONS[fullname]))
        if fullname in operators.FUNCTIONS:
            return guarded(functools.partial(operators.analyze, feature=operators.FUNCTIONS[fullname]))
        if fullname in names.CONTROL:
            return guarded(functools.partial(_feature("control").analyze, name=names.CONTROL[fullname]))
        if fullname in names.AUTODIFF:
            return guarded(functools.partial(_feature("autodiff").analyze, name=names.AUTODIFF[fullname]))
        if fullname.startswith(names.GRAD_LAMBDA_CALLS):  # `st.grad(lambda w: ...)(w)`
            return guarded(_feature("autodiff").lambda_call)
        if fullname.startswith(names.GRAD_CALLS):  # `g(w, x)` of `g = st.grad(f)`
            return guarded(_feature("autodiff").grad_call)
        if fullname in names.SHARD_MAP:  # the function under it keeps its signature
            return guarded(_feature("signature").keeping(
                functools.partial(_feature("boundary").analyze, feature="shard_map")))
        if fullname in names.CUSTOM_OP:
            return guarded(_feature("custom").custom_op_instance)
        if fullname in names.TREE_MAPS:
            return guarded(functools.partial(_feature("pytrees").tree_map, lead=names.TREE_MAPS[fullname]))
        # JAX's own spellings of the rows on typed values: `jnp.exp(x)`, `jax.lax.psum(x, "tp")`
        row = names.jax_row(fullname)
        if row is not None:
            forms = _feature("jax_forms")
            return guarded(functools.partial(forms.analyze_function, row=row,
                                             op=forms.label(fullname)))
        name = names.jax_collective(fullname)
        if name is not None:
            return guarded(functools.partial(_feature("jax_forms").analyze_collective, name=name))
        return None

    def _node(self, fullname: str) -> Any:
        """The symbol-table node of a user name, or None (a name the module table does not
        have yet)."""
        try:
            sym = self.lookup_fully_qualified(fullname)
        except Exception:  # noqa: BLE001 - a name the module table does not have yet
            return None
        return sym.node if sym is not None else None

    def _refined_callee(self, fullname: str) -> CallableType | None:
        """The signature of a function whose parameters declare refinements, else None."""
        if fullname.startswith(_NOT_USER):
            return None
        node = self._node(fullname)
        t = node.var.type if isinstance(node, Decorator) else getattr(node, "type", None)
        p = get_proper_type(t) if t is not None else None
        if isinstance(p, CallableType) and any(refined.has_refinement(a) for a in p.arg_types):
            return p
        return None

    def _pytree_class(self, fullname: str) -> bool:
        """Whether a user name is a dataclass, `eqx.Module`, NamedTuple or nnx Module."""
        if fullname.startswith(_NOT_USER) or "." not in fullname:
            return False
        node = self._node(fullname)
        return isinstance(node, TypeInfo) and _feature("pytrees").is_pytree_class(node)  # type: ignore[no-any-return]

    def _custom_op(self, fullname: str) -> custom.Decl | None:
        """The declaration of a function decorated with `@st.custom_op(...)`."""
        if "." not in fullname or fullname.startswith(("builtins.", "typing", "jax", "numpy.")):
            return None
        node = self._node(fullname)
        # `custom.decorated_declaration` reads only a decorator call of `st.custom_op`: look
        # for one before importing the module
        if not (isinstance(node, Decorator) and any(
                isinstance(d, CallExpr) and isinstance(d.callee, RefExpr)
                and d.callee.fullname in names.CUSTOM_OP for d in node.decorators)):
            return None
        return _feature("custom").decorated_declaration(node)  # type: ignore[no-any-return]

    def get_function_signature_hook(self, fullname: str
                                    ) -> Callable[[FunctionSigContext], FunctionLike] | None:
        if fullname in names.CONTROL:
            return guarded_sig(functools.partial(_feature("control").signature,
                                                 name=names.CONTROL[fullname]))
        if fullname in names.TREE_MAPS:
            return guarded_sig(functools.partial(_feature("pytrees").tree_map_signature,
                                                 lead=names.TREE_MAPS[fullname]))
        if self._pytree_class(fullname):  # its state-hinted fields also take global arrays
            return guarded_sig(_feature("pytrees").constructor)
        if names.jax_widened(fullname):  # JAX's parameters take typed values
            return guarded_sig(_feature("jax_forms").widen)
        # a name of the static tables is spmdtyped's own API, never a declared custom op
        if self._table("function", fullname, self._function_table) is None \
                and self._custom_op(fullname) is not None:
            return guarded_sig(_feature("custom").signature)
        return None

    def get_method_signature_hook(self, fullname: str
                                  ) -> Callable[[MethodSigContext], FunctionLike] | None:
        if fullname == names.UFUNC_CALL:  # JAX's ufunc parameters take SArray
            return guarded_sig(_feature("jax_forms").widen_method)  # type: ignore[arg-type]
        return None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        hook = self._table("method", fullname, self._method_table)
        if hook is None and fullname.endswith(".__getitem__") and self._nnx_variable(fullname):
            hook = guarded(_feature("pytrees").variable_item)  # `self.w[...]` of an `nnx.Param`
        elif hook is None:
            defn = self._helper_method(fullname)
            if defn is not None:  # `self.mlp(h)`: a user method re-checked on the call's states
                hook = guarded(functools.partial(_feature("calls").check_method_call, defn=defn))
        if self._unknown:  # `spmd-unknown`: every method call is watched for a lost state
            watched = _feature("unknown").watch(hook, fullname, self._node)
            return guarded(watched) if watched is not None else None
        return hook  # type: ignore[no-any-return]

    def _nnx_variable(self, fullname: str) -> bool:
        """Whether `Owner.method` is a method of a flax `nnx.Variable` class (`nnx.Param`,
        `nnx.BatchStat`, a user's subclass): mypy names the method by the receiver's class."""
        owner = fullname.rpartition(".")[0]
        if not owner.startswith("flax.") and owner.startswith(_NOT_USER):
            return False
        info = self._node(owner)
        return isinstance(info, TypeInfo) and info.has_base(names.NNX_VARIABLE)

    def _method_table(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        if fullname in operators.METHODS:
            return guarded(functools.partial(operators.analyze, feature=operators.METHODS[fullname]))
        if fullname in names.BOUNDARY_METHODS:
            feature = names.BOUNDARY_METHODS[fullname]
            hook = functools.partial(_feature("boundary").analyze, feature=feature)
            return guarded(_feature("signature").keeping(hook) if feature == "decorate" else hook)
        if fullname == names.CUSTOM_CALL:
            return guarded(_feature("custom").analyze_call)
        if fullname == names.VMAP_CALL:
            return guarded(_feature("autodiff").vmap_call)
        if fullname == names.UFUNC_CALL:  # `jnp.add(x, y)`: JAX's ufunc objects
            return guarded(_feature("jax_forms").analyze_ufunc)
        if fullname in names.WRAPPED_CALLS:
            return guarded(functools.partial(_feature("wrappers").analyze, hooks=self.get_function_hook))
        return None

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        return self._table("attribute", fullname, self._attribute_table)  # type: ignore[no-any-return]

    def _attribute_table(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        if fullname in operators.ATTRIBUTES:
            return guarded(functools.partial(operators.analyze, feature=operators.ATTRIBUTES[fullname]))
        return None

    def report_config_data(self, ctx: ReportConfigContext) -> str | None:
        # The rule table and the JAX rule set are part of every cached result of user code.
        # Installed third-party packages and the standard library do not use spmdtyped: keep
        # their cache entries (JAX's stubs take most of a cold run) across upgrades and settings.
        if not ctx.id.startswith("spmdtyped") and (
                ctx.id.partition(".")[0] in sys.stdlib_module_names or _installed(ctx.path)):
            return None
        # (`unknown = true` adds errors to every cached module: part of the key too)
        return f"{_DIGEST}:{CONFIG.jax}:unknown={CONFIG.unknown}"


def _vmapped() -> bool:
    """Inside the body of a function `jax.vmap` maps (`_mypy.calls.VMAPPED`: its module is
    imported by then)."""
    module = sys.modules.get(f"{__package__}._mypy.calls")
    return module is not None and bool(module.VMAPPED[0])


def _installed(path: str) -> bool:
    """Whether a module path has a `site-packages`, `dist-packages` or `typeshed` component
    (mypy asks for every module of a run, JAX's stubs included: string tests, no `Path`)."""
    path = f"/{path.replace(os.sep, '/')}/"
    return "/site-packages/" in path or "/dist-packages/" in path or "/typeshed/" in path


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point (`plugins = spmdtyped.mypy_plugin`)."""
    return SpmdPlugin

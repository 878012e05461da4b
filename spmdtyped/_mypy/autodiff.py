"""Autodiff: `st.grad`, `st.value_and_grad`, `st.vjp`.

`st.grad(f, argnums)` is typed as a generic function with `f`'s parameters: each
differentiated parameter's state slots become type variables (bounded by the declared axes),
and its gradient has the cotangent state of the *argument* (`_rules.cotangent`: Unreduced and
Reduced swap, Varying kept), so a direct call `st.grad(f)(w, x)` and a later call of
`g = st.grad(f)` both type the gradients from the arguments' own states, as the runtime does
(an Invariant value passed for a `Varying` parameter has an Invariant gradient). The loss is
checked with `_rules.grad_loss_type` (SPMD405). A lambda called at once
(`st.value_and_grad(lambda w: ...)(w)`) is typed from the call's arguments (`lambda_call`).

`jax.vmap(st.grad(f, ...), ...)` is a `VmapOfGrad[G, tuple[L, B, *argnums]]` (`G` the gradient
function, `L` `f`'s declared loss, `B` the types of the arguments `functools.partial(g, *bound)`
binds; the grad may be bound to a name first, `g = st.grad(f)`): its call is `G`'s, and
per-example gradients of replicated parameters are SPMD407 (`_rules.check_vmap_grad`, the
runtime's rule when `st.grad` is traced under `vmap`): the loss varies over the axes `L`
declares that some argument varies over (a loss can vary only where an input does), and a
differentiated argument Invariant there has each per-example gradient summed over the devices
(jax#36886). `jax.vmap(f)` of a function of
the module that takes a gradient inside is a `VmapOfGrad[F, tuple[()]]` (a bound method
`self.per_example`: `VmapOfGrad[F, tuple[R]]`, `R` the receiver's type; a lambda
`jax.vmap(lambda x: st.grad(loss)(p, x))` too, read again from the call's callee): its call checks the body as traced under vmap (`calls.check_vmapped`), where
each gradient call is `grad_call`."""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import (
    ARG_POS,
    CallExpr,
    Context,
    Expression,
    FuncDef,
    FuncItem,
    IntExpr,
    LambdaExpr,
    MemberExpr,
    NameExpr,
    RefExpr,
    TempNode,
    TupleExpr,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.traverser import all_name_and_member_expressions
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    LiteralType,
    TupleType,
    Type,
    TypeOfAny,
    TypeVarId,
    TypeVarLikeType,
    TypeVarType,
    UninhabitedType,
    get_proper_type,
)

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import SpmdType
from . import calls, names, pytrees, refined
from .codes import report
from .config import CONFIG
from .convert import (
    SARRAY,
    any_type,
    arg,
    axes_type,
    from_spmd,
    literal_value,
    named,
    to_operand,
    tuple_items,
    tuple_of,
)
from .extents import assignments

#: full name -> function
FULLNAMES: Final = names.AUTODIFF
VMAP_OF_GRAD: Final = names.VMAP_OF_GRAD
VMAP_CALL: Final = names.VMAP_CALL
_CONTAINERS: Final = ("builtins.dict", "builtins.list", "builtins.tuple")


def analyze(ctx: FunctionContext, name: str) -> Type:
    if name == "vmap":
        return _vmap(ctx)
    return _vjp(ctx) if name == "vjp" else _grad(ctx, name)


def _argnums(expr: Expression | None) -> int | tuple[int, ...] | None:
    if expr is None:
        return 0
    if isinstance(expr, IntExpr):
        return expr.value
    if isinstance(expr, TupleExpr) and all(isinstance(i, IntExpr) for i in expr.items):
        return tuple(i.value for i in expr.items if isinstance(i, IntExpr))
    return None


def cotangent_of(api: Any, t: Type) -> Type | None:
    """The gradient type of a value of type `t` (`_rules.cotangent` on each leaf of a
    tuple/list/dict pytree); None when a leaf's state is unknown."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        o = to_operand(p)
        if not isinstance(o, SpmdType):
            return None
        g = from_spmd(api, _rules.cotangent(o))
        return g.copy_modified(args=[*g.args[:3], refined.cotangent_k(api, p)])
    if isinstance(p, TupleType):
        items = [cotangent_of(api, i) for i in p.items]
        return None if any(i is None for i in items) else \
            p.copy_modified(items=[i for i in items if i is not None])
    if isinstance(p, Instance) and p.type.fullname in _CONTAINERS and p.args:
        leaf = cotangent_of(api, p.args[-1])
        return None if leaf is None else p.copy_modified(args=[*p.args[:-1], leaf])
    return pytrees.class_cotangent(p)


def _cotangent_slots() -> tuple[int, int, int]:
    """Which slot of `SArray[V, U, R]` each slot of a cotangent comes from, read off
    `_rules.cotangent` (Unreduced and Reduced swap: `(0, 2, 1)`)."""
    probe = _rules.cotangent(SpmdType(frozenset({"v"}), frozenset({"u"}), frozenset({"r"})))
    where = {"v": 0, "u": 1, "r": 2}
    out = tuple(where[next(iter(s))] for s in (probe.varying, probe.unreduced, probe.reduced))
    assert len(out) == 3 and sorted(out) == [0, 1, 2]
    return out  # type: ignore[return-value]


COTANGENT_SLOTS: Final = _cotangent_slots()


class _Generic:
    """Builds the generic parameter / gradient types of one `st.grad` call: each non-empty
    slot of a differentiated SArray parameter becomes a type variable bounded by the declared
    axes, so the gradient is the cotangent of the argument's own state (a subset of them)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api, self.namespace = api, namespace
        self.variables: list[TypeVarLikeType] = []

    def _var(self, axes: frozenset[str]) -> TypeVarType:
        n = len(self.variables)
        tv = TypeVarType(f"S{n}", f"{self.namespace}.S{n}", TypeVarId(-(1000 + n), namespace=self.namespace),
                         [], axes_type(self.api, axes), AnyType(TypeOfAny.from_omitted_generics))
        self.variables.append(tv)
        return tv

    def param_and_grad(self, t: Type) -> tuple[Type, Type] | None:
        """(parameter type with its slots generic, gradient type); None: unknown state."""
        p = get_proper_type(t)
        if isinstance(p, Instance) and p.type.fullname == SARRAY:
            o = to_operand(p)
            if not isinstance(o, SpmdType):
                return None
            slots: list[Type] = [self._var(s) if s else UninhabitedType()
                                 for s in (o.varying, o.unreduced, o.reduced)]
            return (p.copy_modified(args=[*slots, *p.args[3:]]),
                    p.copy_modified(args=[*[slots[i] for i in COTANGENT_SLOTS],
                                          refined.cotangent_k(self.api, p)]))
        if isinstance(p, TupleType):
            items = [self.param_and_grad(i) for i in p.items]
            if any(i is None for i in items):
                return None
            pairs = [i for i in items if i is not None]
            return (p.copy_modified(items=[a for a, _ in pairs]),
                    p.copy_modified(items=[b for _, b in pairs]))
        if isinstance(p, Instance) and p.type.fullname in _CONTAINERS and p.args:
            leaf = self.param_and_grad(p.args[-1])
            if leaf is None:
                return None
            return (p.copy_modified(args=[*p.args[:-1], leaf[0]]),
                    p.copy_modified(args=[*p.args[:-1], leaf[1]]))
        own = pytrees.class_cotangent(p)  # a module / dataclass: its fields' hints (no generics)
        return None if own is None else (p, own)


def _grad_name(op: str, fun: str | None, nums: int | tuple[int, ...], has_aux: bool) -> str:
    """The name mypy prints for the function `st.grad(f, ...)` returns (messages only)."""
    fun = fun if fun and fun.isidentifier() else "fun"
    return (f"{op}({fun}" + (f", argnums={nums!r}" if nums != 0 else "")
            + (", has_aux=True" if has_aux else "") + ")")


def _grad(ctx: FunctionContext, name: str) -> Type:
    """`st.grad(f, argnums, has_aux)` / `st.value_and_grad(...)`: see the module docstring;
    `jax.grad` / `jax.value_and_grad` (`name` "jax.grad", ...) the same where the loss is typed."""
    default = ctx.default_return_type
    fun, nums_arg, aux_arg = arg(ctx, "fun"), arg(ctx, "argnums"), arg(ctx, "has_aux")
    ft = get_proper_type(fun[1]) if fun else None
    nums = _argnums(nums_arg[0] if nums_arg else None)
    has_aux = False if aux_arg is None else literal_value(aux_arg[1])
    if not isinstance(ft, CallableType) or nums is None or not isinstance(has_aux, bool):
        return default
    return _grad_type(ctx.api, ctx.context, name, ft, nums, has_aux, default)


def _grad_type(api: Any, context: Context, name: str, ft: CallableType, nums: int | tuple[int, ...],
               has_aux: bool, default: Type) -> Type:
    """The function `st.grad(f, nums, has_aux)` returns, for `f` of type `ft` (`_grad`)."""
    op = name if "." in name else f"st.{name}"
    jax_form, name = "." in name, name.rpartition(".")[2]
    loss_t: Type = ft.ret_type
    aux_t: Type = any_type()
    if has_aux:
        items = tuple_items(ft.ret_type, 2)
        if items is None:
            return default
        loss_t, aux_t = items
    loss = to_operand(loss_t)
    if jax_form and not isinstance(loss, SpmdType):
        return default  # a raw or unknown loss: JAX's own `jax.grad`
    if isinstance(loss, SpmdType):
        try:
            _rules.grad_loss_type(loss, CONFIG.features, op=op)
        except SpmdTypeError as err:
            report(api, err, context)
            return default
    fname = _grad_name(op, ft.name, nums, has_aux)
    generic = _Generic(api, f"spmdtyped.{fname}")
    params = list(ft.arg_types)
    grads: list[Type] = []
    for k in (nums,) if isinstance(nums, int) else nums:
        if k >= len(ft.arg_types):
            return default
        pair = generic.param_and_grad(ft.arg_types[k])
        if pair is None:
            grads.append(any_type())
        else:
            params[k], g = pair
            grads.append(g)
    grads_t = grads[0] if isinstance(nums, int) else tuple_of(api, grads)
    if name == "grad":
        ret_t: Type = tuple_of(api, [grads_t, aux_t]) if has_aux else grads_t
    else:
        value_t = tuple_of(api, [loss_t, aux_t]) if has_aux else loss_t
        ret_t = tuple_of(api, [value_t, grads_t])
    return ft.copy_modified(arg_types=params, ret_type=ret_t, name=fname,
                            variables=[*ft.variables, *generic.variables])


def lambda_call(ctx: FunctionContext) -> Type:
    """`st.value_and_grad(lambda w: loss(w, x))(w)` (`st.grad` too): mypy infers a lambda
    outside of any context with `Any` parameters, so its gradient would be `Any`. Called at
    once, the lambda is inferred again with the call's argument types for its parameters, the
    gradient function is typed from that (`_grad_type`), and the call is checked on it."""
    default = ctx.default_return_type
    call = ctx.context
    inner = call.callee if isinstance(call, CallExpr) else None
    if _LAMBDA_CALL[0]:  # the check of the call below: mypy's own
        return default
    if not (isinstance(inner, CallExpr) and isinstance(inner.callee, RefExpr)
            and FULLNAMES.get(inner.callee.fullname) in _GRADS):
        return default
    fun = _call_arg(inner, "fun", 0)
    nums = _argnums(_call_arg(inner, "argnums", 1))
    aux = _call_arg(inner, "has_aux", 2)
    has_aux = isinstance(aux, NameExpr) and aux.fullname == "builtins.True"
    if not isinstance(fun, LambdaExpr) or nums is None or (aux is not None and not has_aux and not (
            isinstance(aux, NameExpr) and aux.fullname == "builtins.False")):
        return default
    kinds = [k for group in ctx.arg_kinds for k in group]
    if any(k != ARG_POS for k in kinds) or len(kinds) != len(fun.arguments):
        return default
    types = [t for group in ctx.arg_types for t in group]
    context = CallableType(types, kinds, [a.variable.name for a in fun.arguments], any_type(),
                           named(ctx.api, "builtins.function", []))
    checker = getattr(ctx.api, "expr_checker")  # noqa: B009 - TypeChecker, not the interface
    try:
        with ctx.api.msg.filter_errors():
            ft = get_proper_type(checker.accept(fun, type_context=context))
    except Exception:  # noqa: BLE001 - internal API: mypy's own type
        return default
    if not isinstance(ft, CallableType):
        return default
    name = FULLNAMES[inner.callee.fullname]
    g_t = get_proper_type(_grad_type(ctx.api, call, name, ft, nums, has_aux, any_type()))
    if not isinstance(g_t, CallableType):
        return default
    _LAMBDA_CALL[0] = True
    try:
        args = [a for group in ctx.args for a in group]
        with ctx.api.msg.filter_errors():
            ret, _ = checker.check_call(g_t, args, kinds, call, [None] * len(args))
        return ret  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - internal API: mypy's own type
        return default
    finally:
        _LAMBDA_CALL[0] = False


#: inside `lambda_call`'s own check of the call (whose callee has the same name)
_LAMBDA_CALL: Final = [False]
#: the forms `lambda_call` re-infers a lambda for
_GRADS: Final = ("grad", "value_and_grad")


def _vjp(ctx: FunctionContext) -> Type:
    """`st.vjp(fun, *primals)`: `(out, pullback)` (`(out, pullback, aux)` with has_aux), `out`
    of `fun`'s declared result, the pullback returning one cotangent per primal in the primal's
    cotangent state (`_rules.cotangent`; Any where a primal's state is unknown)."""
    default = ctx.default_return_type
    fun, aux = arg(ctx, "fun"), arg(ctx, "has_aux")
    has_aux = False if aux is None else literal_value(aux[1])
    ft = get_proper_type(fun[1]) if fun else None
    if not isinstance(ft, CallableType) or not isinstance(has_aux, bool):
        return default
    try:
        i = ctx.callee_arg_names.index("primals")
    except ValueError:
        return default
    cts = [cotangent_of(ctx.api, t) or any_type() for t in ctx.arg_types[i]]
    out_t: Type = ft.ret_type
    aux_t: Type = any_type()
    if has_aux:
        items = tuple_items(ft.ret_type, 2)
        if items is None:
            return default
        out_t, aux_t = items
    pullback = CallableType([any_type()], [ARG_POS], [None], tuple_of(ctx.api, cts),
                            named(ctx.api, "builtins.function", []), name="st.vjp pullback")
    return tuple_of(ctx.api, [out_t, pullback, *([aux_t] if has_aux else [])])


# ------------------------------------------------------------------------- vmap of st.grad


def _call_arg(call: CallExpr, name: str, index: int) -> Expression | None:
    """Argument `name` (or positional `index`) of a call expression."""
    for i, (n, a) in enumerate(zip(call.arg_names, call.args, strict=True)):
        if n == name or (n is None and i == index and call.arg_kinds[i] == ARG_POS):
            return a
    return None


def _vmap(ctx: FunctionContext) -> Type:
    """`jax.vmap(st.grad(f, ...), ...)`: a `VmapOfGrad` (see the module docstring); the grad
    may be bound to a name first (`g = st.grad(f)`) or have leading arguments bound by
    `functools.partial(g, w)` (`_grad_of`); any other `jax.vmap` keeps JAX's own type."""
    default = ctx.default_return_type
    if not (ctx.args and ctx.args[0]):
        return default
    found = _grad_of(ctx.api, ctx.args[0][0])
    if found is None:  # a function, method or lambda of the module's that takes a gradient inside
        return _vmap_of_body(ctx, ctx.args[0][0]) or default
    g_expr, bound = found
    g_t = get_proper_type(_type_of(ctx.api, g_expr))
    loss = _loss_and_nums(ctx.api, g_expr)
    if not isinstance(g_t, CallableType) or loss is None:
        return default
    loss_t, nums = loss
    int_t = named(ctx.api, "builtins.int", [])
    bound_t = tuple_of(ctx.api, [_type_of(ctx.api, b) for b in bound])
    meta = tuple_of(ctx.api, [loss_t, bound_t, *(LiteralType(k, int_t) for k in nums)])
    return named(ctx.api, VMAP_OF_GRAD, [g_t, meta])


def _vmap_of_body(ctx: FunctionContext, f: Expression) -> Type | None:
    """`jax.vmap(f)` of a function of the module whose body takes a gradient: a module
    function or a lambda (`jax.vmap(lambda x: st.grad(loss)(p, x))`, found again at the call:
    `_vmapped_lambda`) is a `VmapOfGrad[F, tuple[()]]`, a bound method `self.per_example` /
    `model.per_example` a `VmapOfGrad[F, tuple[R]]` (`R` the receiver's type); else None."""
    f_t = get_proper_type(_type_of(ctx.api, f))
    if not isinstance(f_t, CallableType):
        return None
    if isinstance(f, LambdaExpr):
        defn: FuncItem = f
        if not calls.user_code(ctx.api):
            return None
    elif isinstance(f_t.definition, FuncDef) and calls.has_body(ctx.api, f_t.definition):
        defn = f_t.definition
    else:
        return None
    if not (calls.mentions(defn, _GRAD_FULLNAMES) or (
            isinstance(defn, LambdaExpr) and _names_a_grad(ctx.api, defn))):
        return None
    meta: list[Type] = []
    if isinstance(defn, FuncDef) and calls.is_method(defn):
        if not (isinstance(f, MemberExpr) and f.name == defn.name):
            return None  # `Model.per_example` unbound, or a method under another name
        meta = [_type_of(ctx.api, f.expr)]
    return named(ctx.api, VMAP_OF_GRAD, [f_t, tuple_of(ctx.api, meta)])


def _names_a_grad(api: Any, fun: LambdaExpr) -> bool:
    """Whether a lambda calls a gradient function the enclosing function bound to a name
    (`g = jax.grad(loss)`; `jax.vmap(lambda x: g(p, x))`)."""
    own = {a.variable.name for a in fun.arguments}
    names, _ = all_name_and_member_expressions(fun.expr())
    return any(n.name not in own and _grad_of(api, n) is not None for n in names)


def _vmapped_lambda(api: Any, call: Context) -> LambdaExpr | None:
    """The lambda of `jax.vmap(lambda ...: ...)(*args)`, or of `f(*args)` of a name assigned
    `jax.vmap(lambda ...)` once in the enclosing function (a lambda is no symbol a type can
    name as its definition)."""
    expr = call.callee if isinstance(call, CallExpr) else None
    if isinstance(expr, NameExpr):
        found = assignments(api, expr)
        expr = found[0][0] if len(found) == 1 and found[0][1] is None else None
    if isinstance(expr, CallExpr) and isinstance(expr.callee, RefExpr) \
            and FULLNAMES.get(expr.callee.fullname) == "vmap" and expr.args \
            and expr.arg_kinds[0] == ARG_POS and isinstance(expr.args[0], LambdaExpr):
        return expr.args[0]
    return None


def _loss_and_nums(api: Any, g_expr: CallExpr) -> tuple[Type, tuple[int, ...]] | None:
    """The declared loss type of `st.grad(f, argnums, has_aux)`'s `f` (a typed one) and the
    differentiated argnums; None where either is unknown."""
    fun = _call_arg(g_expr, "fun", 0)
    lookup = getattr(api, "lookup_type_or_none", None)
    ft = get_proper_type(lookup(fun)) if fun is not None and lookup is not None else None
    nums = _argnums(_call_arg(g_expr, "argnums", 1))
    aux = _call_arg(g_expr, "has_aux", 2)
    has_aux = aux is not None and not (isinstance(aux, NameExpr) and aux.fullname == "builtins.False")
    if not isinstance(ft, CallableType) or nums is None or (has_aux and not (
            isinstance(aux, NameExpr) and aux.fullname == "builtins.True")):
        return None
    loss_t: Type | None = ft.ret_type
    if has_aux:
        items = tuple_items(ft.ret_type, 2)
        loss_t = items[0] if items is not None else None
    if loss_t is None or not isinstance(to_operand(loss_t), SpmdType):
        return None
    return loss_t, (nums,) if isinstance(nums, int) else nums


def _grad_of(api: Any, expr: Expression) -> tuple[CallExpr, list[Expression]] | None:
    """The `st.grad(f, ...)` call (or `st.value_and_grad`, `jax.grad` ...) that `jax.vmap`'s
    function is, with the arguments bound before the call's: itself, a name assigned it once
    in the enclosing function (or module), or `functools.partial(<either>, *bound)`."""
    bound: list[Expression] = []
    for _ in range(3):  # a name of a partial of a name of the grad, at most
        if isinstance(expr, NameExpr):
            found = assignments(api, expr)
            if len(found) != 1 or found[0][1] is not None:
                return None
            expr = found[0][0]
        call = expr
        if not (isinstance(call, CallExpr) and isinstance(call.callee, RefExpr)):
            return None
        if FULLNAMES.get(call.callee.fullname) in _VMAPPED_GRADS:
            return call, bound
        if call.callee.fullname != "functools.partial" or bound or not call.args \
                or any(k != ARG_POS for k in call.arg_kinds):
            return None
        expr, bound = call.args[0], list(call.args[1:])
    return None


def _type_of(api: Any, expr: Expression) -> Type:
    """The type mypy gave `expr` (checked already: no second report), else its inference."""
    try:
        t: Type = api.lookup_type(expr)
    except KeyError:
        with api.msg.filter_errors():
            t = api.expr_checker.accept(expr)
    return t


#: the gradient forms `jax.vmap` of which is checked (SPMD407), and their full names
_VMAPPED_GRADS: Final = ("grad", "value_and_grad", "jax.grad", "jax.value_and_grad")
_GRAD_FULLNAMES: Final = frozenset(n for n, f in FULLNAMES.items() if f in _VMAPPED_GRADS)


def vmap_call(ctx: MethodContext) -> Type:
    """A call of `jax.vmap(st.grad(f, ...), ...)`: SPMD407 for a differentiated argument
    Invariant over an axis the per-example loss varies over; the result is the gradient
    function's (mypy's own inference of that call), Any where it cannot be had."""
    p = get_proper_type(ctx.type)
    if not (isinstance(p, Instance) and len(p.args) == 2):
        return ctx.default_return_type
    g_t, meta = get_proper_type(p.args[0]), get_proper_type(p.args[1])
    if not (isinstance(g_t, CallableType) and isinstance(meta, TupleType)):
        return any_type()
    positional = _positional(ctx)
    if len(meta.items) < 2:  # `jax.vmap(f)` of a function, method, lambda with a gradient inside
        defn = g_t.definition if isinstance(g_t.definition, FuncDef) else _vmapped_lambda(ctx.api, ctx.context)
        if defn is not None:
            calls.check_vmapped(ctx, defn, [*meta.items, *positional])
        return _result(ctx, g_t, [])
    bound = get_proper_type(meta.items[1])
    bound_ts = list(bound.items) if isinstance(bound, TupleType) else []
    nums = [k for k in (getattr(get_proper_type(i), "value", None) for i in meta.items[2:])
            if isinstance(k, int)]
    _per_example(ctx.api, ctx.context, g_t, meta.items[0], nums, [*bound_ts, *positional])
    return _result(ctx, g_t, bound_ts)


def _positional(ctx: FunctionContext | MethodContext) -> list[Type]:
    """The types of a call's positional arguments."""
    return [t for group, kinds in zip(ctx.arg_types, ctx.arg_kinds, strict=True)
            for t, k in zip(group, kinds, strict=True) if k == ARG_POS]


def _per_example(api: Any, context: Context, g_t: CallableType, loss_t: Type, nums: list[int],
                 positional: list[Type]) -> None:
    """SPMD407 for the call of gradient function `g_t` (loss `loss_t`, argnums `nums`) traced
    under `jax.vmap` on arguments of types `positional`."""
    states = [to_operand(t) for t in positional]
    loss = to_operand(loss_t)
    varying_in = frozenset().union(*(s.varying for s in states if isinstance(s, SpmdType)))
    if not (isinstance(loss, SpmdType) and loss.varying & varying_in):
        return
    params: list[tuple[str, SpmdType]] = []
    for k in nums:
        state = states[k] if k < len(states) else None
        if isinstance(state, SpmdType):
            name = g_t.arg_names[k] if k < len(g_t.arg_names) else None
            params.append((name or f"argument {k}", state))
    try:
        op = g_t.name.partition("(")[0] if g_t.name and "(" in g_t.name else "st.grad"
        _rules.check_vmap_grad(SpmdType(loss.varying & varying_in), params, op=op)
    except SpmdTypeError as err:
        report(api, err, context)


def grad_call(ctx: FunctionContext) -> Type:
    """A call of `st.grad(f)` & co. (`g(w, x)`, `st.grad(f)(w, x)`) in the body of a function
    `jax.vmap` maps (`calls.check_vmapped`): traced under vmap, SPMD407 as for
    `jax.vmap(st.grad(f))`; elsewhere nothing (mypy's own result)."""
    default = ctx.default_return_type
    call = ctx.context
    if not calls.VMAPPED[0] or not isinstance(call, CallExpr):
        return default
    found = _grad_of(ctx.api, call.callee)
    loss = _loss_and_nums(ctx.api, found[0]) if found is not None and not found[1] else None
    g_t = get_proper_type(_type_of(ctx.api, found[0])) if found is not None else None
    if loss is None or not isinstance(g_t, CallableType):
        return default
    positional = _positional(ctx)
    _per_example(ctx.api, call, g_t, loss[0], list(loss[1]), positional)
    return default


def _result(ctx: MethodContext, g_t: CallableType, bound: list[Type]) -> Type:
    """mypy's inference of the gradient function's call on the same arguments (after those
    `functools.partial` bound; its errors, already reported for the arguments, filtered),
    else Any."""
    try:
        args = [*(TempNode(t, context=ctx.context) for t in bound), *(a for group in ctx.args for a in group)]
        kinds = [*(ARG_POS for _ in bound), *(k for group in ctx.arg_kinds for k in group)]
        names = [*(None for _ in bound), *(n for group in ctx.arg_names for n in group)]
        with ctx.api.msg.filter_errors():
            ret, _ = ctx.api.expr_checker.check_call(g_t, args, kinds, ctx.context, names)
        return ret  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - internal API: an untyped result
        return any_type()

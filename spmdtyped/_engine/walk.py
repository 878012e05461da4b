"""Walk a traced jaxpr with the strict rules of `_rules`: the engine of `infer` and of
`typed_shard_map`'s check.

Each equation is checked on the states JAX recorded for its inputs (`aval.manual_axis_type`),
so nested jaxprs (jit, scan, while, cond, custom_jvp/vjp, remat) need no argument mapping:
they are walked with their own avals. For every equation with a rule, the rule's prediction
is compared with JAX's output state; a difference without a violation is a rule-table gap
(`mismatches`). Two things JAX hides are recovered from the equation's Python stack:

- a `pvary` JAX auto-inserted in front of a collective (psum/pmean/ppermute/all_gather of an
  Invariant value): the collective is checked on the value *before* that pvary, which is the
  strict rule's SPMD103 (double counting);
- the casts shard_map inserts at its boundary (`add_implicit_pvary*`): outputs are reported,
  and checked against out_specs, with the state the function returned.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback
from collections.abc import Sequence
from typing import Any

from .. import _compat, _rules, _surface
from .._errors import SpmdTypeError, error
from .._frames import calling_frame, is_installed, is_library, library_frames
from .._rules import SpmdType
from .eqns import EqnView, Views
from .frames import primitive_detail, user_frame
from .primitives import CALLS
from .refine_facts import from_autodiff

#: user-facing collectives, looked up on the stack to name the API a primitive came from: the
#: `jax.lax` names of the surface table (`_surface.LAX_NAMES`)
_API_NAMES = _surface.LAX_NAMES
#: the collective primitives whose check reads their operands' producers (`Walk._effective`:
#: every collective but the casts)
_READS_PRODUCERS = frozenset(name for name, rule in _surface.AXIS_PRIMITIVES.items()
                             if not _rules.AXIS_OPS[rule].is_cast)


def call_site(frames: Sequence[tuple[str, int, str]], api: str) -> tuple[str, int] | None:
    """The user's frame that called the library function named like `api` (`"vmap"`: the
    `jax.vmap(...)(...)` line; an installed package's wrapper of it too, e.g.
    `eqx.filter_value_and_grad`), outward from the bind; None when the stack has no such
    call."""
    seen = False
    for file, line, fn in frames:
        if is_library(file) or (seen and is_installed(file)):
            seen = seen or api in fn
        elif seen:
            return file, line
    return None


def _library_functions(frames: Sequence[tuple[str, int, str]]) -> list[str]:
    """Function names of the library frames between the bind and the user's code."""
    return [fn for _file, fn in library_frames(frames)]


def collective_api(frames: Sequence[tuple[str, int, str]], default: str) -> str:
    """The `jax.lax` collective the user called to bind an equation (its outermost library
    frame named in the surface table: `jax.lax.pmean` for the psum it binds), or `default`."""
    fns = _library_functions(frames)
    for fn in reversed(fns):  # outermost library frame first: the API the user called
        if fn in _API_NAMES:
            return f"jax.lax.{fn}"
    return default


def _is_boundary_cast(frames: Sequence[tuple[str, int, str]]) -> bool:
    return any("add_implicit_pvary" in fn for fn in _library_functions(frames))


def _autodiff_cast(frames: Sequence[tuple[str, int, str]]) -> bool:
    """A cast JAX's autodiff made (a transposed psum, the linearization of a custom_vjp
    call's casts): the gradient's own, not a collective the user applied twice."""
    return from_autodiff(frames, user_frame(frames)) or any(
        "LinearizeTrace" in fn or "JVPTrace" in fn for fn in _library_functions(frames))


def _is_auto_pvary(frames: Sequence[tuple[str, int, str]]) -> bool:
    """A pvary JAX inserted itself (not `jax.lax.pcast`/`st.pvary`)."""
    fns = _library_functions(frames)
    if "pcast" in fns:
        return False
    return bool(fns) and fns[-1] != "pvary"  # a direct core.pvary call is the user's


@dataclasses.dataclass(frozen=True)
class Step:
    """One checked equation: where it came from and the states in and out."""

    file: str | None
    line: int | None
    primitive: str
    op: str
    in_types: tuple[SpmdType, ...]
    out_types: tuple[SpmdType, ...]
    depth: int
    #: a cast JAX inserted itself (auto-pvary of an operand, shard_map's boundary casts)
    auto: bool = False
    #: the code of the violation found at this equation, if any
    violation: str | None = None

    def describe(self, order: Sequence[str] | None = None) -> str:
        ins = ", ".join(str(t) for t in self.in_types) or "-"
        outs = ", ".join(str(t) for t in self.out_types)
        what = self.primitive if self.op == self.primitive else f"{self.primitive} ({self.op})"
        flag = f"   <-- {self.violation}" if self.violation else ""
        return f"{'  ' * self.depth}{what}: ({ins}) -> {outs}{flag}"


def exception_source(e: BaseException) -> tuple[str, int] | None:
    """The innermost user frame of an exception raised while tracing."""
    frames = [(fs.filename, fs.lineno or 0, fs.name) for fs in traceback.extract_tb(e.__traceback__)]
    return user_frame(frames[::-1])


def raised_at(e: BaseException) -> tuple[str, int] | None:
    """Where an error a face raises belongs when nothing located it: the innermost user frame
    of its traceback, else of the exception it was raised from (JAX's, translated), else the
    user's line that called into spmdtyped (an argument JAX rejected before any user code
    ran: `_frames.calling_frame`)."""
    cause = e.__cause__
    return exception_source(e) or (exception_source(cause) if cause is not None else None) \
        or calling_frame()


def function_source(f: Any) -> tuple[str, int] | None:
    """`f`'s `def` line: where a boundary (out_specs) error belongs."""
    for _ in range(16):  # a functools.partial, a jitted or functools.wraps-decorated function
        if getattr(f, "__code__", None) is not None:
            break
        f = f.func if isinstance(f, functools.partial) else getattr(f, "__wrapped__", None)
    code = getattr(f, "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else None


def located(e: SpmdTypeError, where: tuple[str, int] | None, extra: str | None = None) -> SpmdTypeError:
    """A copy of `e` that names the user's source line (`.file`, `.line`, `.source`)."""
    if e.source is not None:
        return e
    details = list(e.details)
    if extra:
        details.append(extra)
    if where is not None:
        details.append(f"at {where[0]}:{where[1]}")
    new = error(e.code, e.headline, axes=e.axes, states=e.states, fix=e.fix, op=e.op,
                details=details)
    if where is not None:
        new.file, new.line = where
        new.source = f"{where[0]}:{where[1]}"
    return new


def locate(e: SpmdTypeError, where: tuple[str, int] | None) -> None:
    """Name the user's source line on `e` itself (`.file`, `.line`, `.source`), as `located`
    does on a copy: for an error raised while the body traced (a typed value's eager check),
    whose traceback and chain stay as they are."""
    if where is None or e.source is not None:
        return
    e.file, e.line = where
    e.source = f"{where[0]}:{where[1]}"


class _Where:
    """An equation's Python stack and user frame, computed on first use."""

    __slots__ = ("_view", "_parent", "_value")
    _UNSET: Any = object()

    def __init__(self, view: EqnView, parent: _Where | tuple[str, int] | None) -> None:
        self._view, self._parent = view, parent
        self._value: Any = _Where._UNSET

    @property
    def frames(self) -> tuple[tuple[str, int, str], ...]:
        return self._view.frames

    def get(self) -> tuple[str, int] | None:
        if self._value is _Where._UNSET:
            parent = self._parent.get() if isinstance(self._parent, _Where) else self._parent
            self._value = user_frame(self.frames) or parent
        return self._value  # type: ignore[no-any-return]


@dataclasses.dataclass
class Walk:
    """Accumulates steps, violations and rule-table mismatches over a jaxpr and its children."""

    features: _rules.Features = dataclasses.field(default_factory=lambda: _compat.FEATURES)
    steps: list[Step] = dataclasses.field(default_factory=list)
    violations: list[SpmdTypeError] = dataclasses.field(default_factory=list)
    mismatches: list[str] = dataclasses.field(default_factory=list)
    #: record a `Step` per equation (infer's listing); typed_shard_map needs only violations
    record_steps: bool = True
    _seen: set[tuple[str, Any, Any]] = dataclasses.field(default_factory=set)
    #: id(var) -> its value, for the scalar literals that flow into a nested jit (jnp.pad's
    #: padding value): the rows that depend on arguments read them (`_rules.primitive_rule`)
    _known: dict[int, object] = dataclasses.field(default_factory=dict)
    #: inside a call whose outputs keep every Unreduced axis of its inputs (jnp.pad's
    #: reflect / symmetric modes flip unreduced slices and concatenate them back): a
    #: primitive on which JAX drops the state there computes the right sums (issue 27)
    _kept_unreduced: int = 0
    #: id(var) of the values such a primitive made there: JAX types them without the axis
    #: (`concatenate` of one with an Unreduced slice is the Unreduced value JAX says it is)
    _dropped: set[int] = dataclasses.field(default_factory=set)
    #: the nested jaxprs walked with nothing found (no violation, mismatch or dropped state),
    #: keyed by `Views.shape` and what the walk of it reads besides its avals (the known
    #: scalars of its inputs, whether inside a call that keeps Unreduced axes): a jaxpr that
    #: many equations share (`jax.nn.relu`'s jit, once per layer), or that JAX traces anew at
    #: each call (its `custom_jvp`), is walked once
    _clean: dict[Any, Any] = dataclasses.field(default_factory=dict)
    #: the `EqnView.key`s of the equations checked with nothing found whose check reads only
    #: their static facts (see `eqn`): a program's repeated layers check each once
    _clean_eqns: set[int] = dataclasses.field(default_factory=set)
    #: each equation's static facts, read once (the refinement walk of the same check reads
    #: the same ones: `check.check_shard_map`)
    views: Views = dataclasses.field(default_factory=Views)
    #: the collective and elementwise rules' predictions, by what they read (`_predict`)
    _predicted: dict[Any, list[SpmdType]] = dataclasses.field(default_factory=dict)

    def release(self) -> None:
        """Drop what only the walk itself reads (each equation's view, the memos), keeping what
        it found (steps, violations, mismatches): the check is over."""
        self.views = Views()
        self._predicted, self._clean, self._known = {}, {}, {}
        self._clean_eqns, self._dropped = set(), set()

    def violation(self, e: SpmdTypeError, where: tuple[str, int] | None, extra: str) -> None:
        key = (e.code, where, e.headline)
        if key not in self._seen:
            self._seen.add(key)
            self.violations.append(located(e, where, extra))

    def jaxpr(self, jaxpr: Any, depth: int = 0,
              parent: _Where | tuple[str, int] | None = None) -> dict[int, Any]:
        producers: dict[int, Any] = {}
        # (`eqn`'s first test, made here: a key in `_clean_eqns` is one whose equations'
        # check reads only their static facts, unless steps are recorded or a call keeps
        # Unreduced axes around it)
        clean = () if self.record_steps or self._kept_unreduced else self._clean_eqns
        for view in self.views.all(jaxpr):
            eqn = view.eqn
            if view.key not in clean:
                self.eqn(view, producers, depth, parent)
            for v in eqn.outvars:
                producers[id(v)] = eqn
        return producers

    def eqn(self, view: EqnView, producers: dict[int, Any], depth: int,
            parent: _Where | tuple[str, int] | None = None) -> None:
        eqn, name = view.eqn, view.name
        # an equation whose check reads only its static facts (no collective but a cast:
        # `_effective` reads a collective's producers; no nested jaxpr, no operand value, no
        # steps, no Unreduced-keeping call around it) is checked once per `EqnView.key`
        static = None if (self.record_steps or self._kept_unreduced or view.subs
                          or name in _rules.ARGUMENT_PRIMITIVES or name in _READS_PRODUCERS
                          ) else view.key
        if static is not None and static in self._clean_eqns:
            return
        mismatches = len(self.mismatches)
        # equations of a cached inner jaxpr (jnp.cumsum's jit) may have no user frame: they
        # belong to the line of the enclosing equation (read lazily: only steps, violations
        # and collectives need the Python stack of an equation)
        loc = _Where(view, parent)
        ins, outs, subs = view.types, view.outs, view.subs
        op = name
        predicted: list[SpmdType] | None = None
        code = None
        try:
            if name in _surface.AXIS_PRIMITIVES:
                rule = _surface.AXIS_PRIMITIVES[name]
                ins = self._effective(eqn, rule, ins, producers, view.axes)
                if self.record_steps:
                    op = collective_api(loc.frames, name)
                try:
                    predicted = self._collective(view, rule, ins, op)
                except SpmdTypeError:
                    if op != name:
                        raise
                    # the message names the API the user called (read from the stack only now)
                    op = collective_api(loc.frames, name)
                    predicted = self._collective(view, rule, ins, op)
            elif name in _rules.PRIMITIVES:
                predicted = self._elementwise(view, ins)
            elif not subs:
                self._drops_unreduced(name, ins, outs)
        except SpmdTypeError as e:
            code = e.code
            if self._kept_unreduced and e.code == "SPMD202" \
                    and _rules.PRIMITIVES.get(name) in _rules.JAX_DROPPING:
                self._dropped.update(id(v) for v in eqn.outvars)
            elif not (self._kept_unreduced and e.code == "SPMD201" and all(
                    t.unreduced or id(v) in self._dropped or _compat.literal_value(v) is not None
                    for v, t in zip(eqn.invars, ins, strict=True))):
                self.violation(e, loc.get(), primitive_detail(name, loc.frames))
        else:
            if predicted is not None and tuple(predicted) != outs[:len(predicted)]:
                where = loc.get()
                at = f"{where[0]}:{where[1]}" if where else "?"
                self.mismatches.append(
                    f"{at}: {name}: the rule table predicts "
                    f"{', '.join(map(str, predicted))}, JAX computed {', '.join(map(str, outs))}")
        if self.record_steps:
            frames = loc.frames
            auto = (name == "pvary" and _is_auto_pvary(frames)) or _is_boundary_cast(frames)
            where = loc.get()
            self.steps.append(Step(where[0] if where else None, where[1] if where else None,
                                   name, op, ins, outs, depth, auto, code))
        if name == "convert_element_type" and eqn.invars:  # a literal stays known through it
            value = self._value(eqn.invars[0])
            if value is not _rules.UNKNOWN:
                self._known[id(eqn.outvars[0])] = value
        unreduced_in = frozenset().union(*(t.unreduced for t in ins)) if name in CALLS \
            else frozenset()
        kept = bool(unreduced_in and outs
                    and all(unreduced_in <= t.unreduced for t in outs))
        self._kept_unreduced += kept
        for sub in subs:
            if len(subs) == 1 and len(sub.invars) == len(eqn.invars) and name in CALLS:
                for v, inner in zip(eqn.invars, sub.invars, strict=True):
                    value = self._value(v)
                    if value is not _rules.UNKNOWN:
                        self._known[id(inner)] = value
            self._sub(sub, depth + 1, loc)
        self._kept_unreduced -= kept
        if self._kept_unreduced and name in CALLS and unreduced_in and not kept:
            self._dropped.update(id(v) for v in eqn.outvars)  # jnp.flip's jit, in jnp.pad's
        if static is not None and code is None and mismatches == len(self.mismatches):
            self._clean_eqns.add(static)

    def _sub(self, sub: Any, depth: int, loc: _Where) -> None:
        """Walk a nested jaxpr, once per `_clean` key (see there)."""
        key = None
        shape = None if self.record_steps else self.views.shape(sub)
        if shape is not None:
            key = (shape, bool(self._kept_unreduced),
                   tuple(self._known.get(id(v), _rules.UNKNOWN) for v in sub.invars))
            try:
                if key in self._clean:
                    return
            except TypeError:   # a known value that is not hashable: walked every time
                key = None
        found = (len(self.violations), len(self.mismatches), len(self._dropped), len(self._seen))
        self.jaxpr(sub, depth, loc)
        if key is not None and found == (len(self.violations), len(self.mismatches),
                                         len(self._dropped), len(self._seen)):
            self._clean[key] = None

    def _value(self, v: Any) -> object:
        """A scalar literal's value (in the jaxpr, or passed into this nested call), else
        `UNKNOWN`."""
        value = _compat.literal_value(v)
        return self._known.get(id(v), _rules.UNKNOWN) if value is None else value

    # -- collectives and casts
    def _effective(self, eqn: Any, rule: str, ins: tuple[SpmdType, ...],
                   producers: dict[int, Any], axes: tuple[str, ...]) -> tuple[SpmdType, ...]:
        """The states the user passed to a collective over `axes`: before a pvary JAX inserted
        for it."""
        out: list[SpmdType] = []
        is_cast = _rules.AXIS_OPS[rule].is_cast
        for v, t in zip(eqn.invars, ins, strict=True):
            src = producers.get(id(v))
            if (not is_cast and src is not None and _compat.primitive_name(src) == "pvary"
                    and set(src.params.get("axes", ())) & set(axes)
                    and _is_auto_pvary(frames := _compat.eqn_frames(src))
                    and not _autodiff_cast(frames)):
                # (a pvary JAX's transposition made, e.g. of a psum, is the gradient's own)
                # JAX pvary'd an Invariant input to make the collective type-check: check the
                # collective on the value the user passed (strict: SPMD103)
                t = _compat.aval_type(src.invars[0].aval)
            out.append(t)
        return tuple(out)

    # -- elementwise, structural, reductions
    def _collective(self, view: EqnView, rule: str, ins: Sequence[SpmdType], op: str
                    ) -> list[SpmdType]:
        """The states the rule of a collective equation predicts for the operands' states
        `ins` (`_predict`; the API name `op` is read only by an error)."""
        return self._predict(view, ins, (), lambda: [
            _rules.axis_op(rule, t, view.axes, self.features, op=op) for t in ins])

    def _elementwise(self, view: EqnView, ins: Sequence[SpmdType]) -> list[SpmdType]:
        """The states the rule of an elementwise equation predicts (`_predict`, with its
        operands' values for the rows that read them)."""
        values = tuple(self._value(v) for v in view.eqn.invars) \
            if view.name in _rules.ARGUMENT_PRIMITIVES else ()
        return self._predict(view, ins, values,
                             lambda: self._elementwise_rule(view.eqn, view.name, ins))

    def _predict(self, view: EqnView, ins: Sequence[SpmdType], values: tuple[object, ...],
                 rule: Any) -> list[SpmdType]:
        """`rule()`, memoized per walk on the equation's static facts (`EqnView.key`), the
        operands' states and `values`; a rule's error is raised again at each equation."""
        try:
            key = None if view.key is None else (view.key, tuple(ins), *values)
            got = None if key is None else self._predicted.get(key)
        except TypeError:   # a value that is not hashable
            key = got = None
        if got is None:
            got = rule()
            if key is not None:
                self._predicted[key] = got
        return got

    def _elementwise_rule(self, eqn: Any, name: str, ins: Sequence[SpmdType]) -> list[SpmdType]:
        # the rule `st.*` applies for these arguments (pad's padding value, astype's dtypes)
        params = {"new_dtype": _compat.dtype_name(eqn.params["new_dtype"])} \
            if "new_dtype" in eqn.params else {}
        rule = _rules.primitive_rule(name, params, [self._value(v) for v in eqn.invars],
                                     _compat.dtype_name(getattr(eqn.invars[0].aval, "dtype", None))
                                     if eqn.invars else _rules.UNKNOWN)
        n = _rules.PRIMITIVE_OPERANDS.get(name)
        ops = list(ins[:n] if n else ins)
        if name == "select_n":
            ops = [ops[0], *ops[:0:-1]]
        if len(ops) == 1:
            t = _rules.unary(rule, ops[0], self.features, op=name)
        else:
            t = _rules.combine(rule, ops, self.features, op=name).type
        return [t] * len(eqn.outvars)

    def _drops_unreduced(self, name: str, ins: Sequence[SpmdType], outs: Sequence[SpmdType]) -> None:
        """A primitive without a rule that loses an input's Unreduced state: JAX has no
        Unreduced rule for it and silently computes on the partial values (reference Q2)."""
        u = frozenset().union(*(t.unreduced for t in ins)) if ins else frozenset()
        if not u:
            return
        kept = frozenset().union(*(t.unreduced for t in outs)) if outs else frozenset()
        lost = sorted(u - kept)
        if lost:
            t = next(t for t in ins if t.unreduced)
            raise error("SPMD202", f"{name} has no Unreduced rule, but its input is Unreduced on "
                        f"{lost} (JAX silently drops the state and computes on partial values)",
                        axes=lost, states=t.states(lost), op=name,
                        fix=f"{name}(jax.lax.psum(x, {tuple(lost) if len(lost) > 1 else lost[0]!r}))")


def boundary_source(var: Any, producers: dict[int, Any]) -> Any:
    """The value the function returned, before shard_map's boundary casts."""
    src = producers.get(id(var))
    while src is not None and _is_boundary_cast(_compat.eqn_frames(src)):
        var = src.invars[0]
        src = producers.get(id(var))
    return var


def library_functions(frames: Sequence[tuple[str, int, str]]) -> list[str]:
    """Function names of the library frames between the bind and the user's code (innermost
    first); the communication report reads the collective the user called from them."""
    return _library_functions(frames)


def is_auto_pvary(frames: Sequence[tuple[str, int, str]]) -> bool:
    """Whether a pvary equation with this stack was inserted by JAX itself."""
    return _is_auto_pvary(frames)

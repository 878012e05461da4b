"""The program JAX runs under `check_vma=False`: the gradients it leaves unsummed (SPMD410),
sums twice (SPMD411) or computes from a cotangent left partial (SPMD412).

Production code opts out of JAX's checks at most of its shard_map call sites
(`check_vma=False`). JAX then records no state (every value is typed Invariant), so the
state walk (`walk.Walk`) has nothing to read, and JAX's autodiff means something else:

- with the checks on, the gradient of a value replicated over an axis is summed over it in
  the backward pass (the transpose of the pvary JAX inserts where the value meets per-device
  data); with them off there is no pvary to transpose, and each device keeps its own
  partial gradient. Returned, or used to update parameters returned, under an out_spec
  replicated over the axis, one device's partial gradient comes out: the step trains on one
  device's batch, silently (SPMD410);
- with the checks on, a psum inside the differentiated function transposes to a pvary; with
  them off, to a psum (the pmap convention, where each device holds a part of the
  cotangent). The cotangent of a psum's result is usually the same on every device (the loss
  after a row-parallel all-reduce), so that psum sums n equal copies: every gradient
  upstream is n times too large (jax#3970, SPMD411). A pmean divides by n first; a pmean of
  the gradient over the axis divides what a psum'd loss's transpose multiplied (the n
  cancels: jax#3970's way out).
- with the checks on, the cotangent of a value replicated over an axis where it meets
  per-device weights (a column-parallel matmul's input) is summed over the axis by the
  transpose of the pvary; with them off each device keeps a partial sum, and the gradients
  computed from it (the layers below, their weights sharded over the axis) are wrong on
  every device, silently (SPMD412: Megatron's copy-to-tensor-parallel region forgotten).

The program's checked trace (`st.adapters.infer(..., check_vma=False)`) sees neither: its
gradient is summed once. `UncheckedWalk` walks the body JAX runs and computes, per value:

- `varying`: the manual axes over which it may differ between devices: the axes its in_spec
  names, `axis_index`, and each collective's row of `_rules.AXIS_OPS` (by
  `_surface.axis_primitive`) applied to what actually differs (`jax_on` for an input that
  does not: a psum of equal values is equal, a ppermute of them is not known to be). An
  all_gather's result is the same on every device: JAX types it Varying with the checks on,
  its `all_gather_invarying` row says what it holds. Any other equation's results may
  differ wherever one of its operands does; control flow joins its branches and iterations,
  and a varying predicate makes the results vary.
- `unsummed`: the axes over which it carries a gradient JAX left unsummed, each with where
  the gradient was taken. A gradient (`gradients.read`: defined by the backward pass, used
  outside it) that varies over an axis over which none of its primals does is unsummed
  there (with the checks on JAX would have made it Invariant); it flows into every result
  computed from it (an optimizer update, a clipped norm) until a reduction over the axis
  (psum, pmean, pmax, pmin, an all_gather) ends it.
- `scaled`: the axes over which a summing collective of the backward pass (a psum, or the
  reduce-scatter an all_gather transposes to) summed a cotangent that does not vary there,
  with the forward collective's line; a pmean over the axis ends it.
- `partial`: the axes over which a value of the backward pass is a partial sum: it varies
  there and none of the forward operands it may be the cotangent of does (the operands of
  the forward equations bound by the same calls, file, line and bytecode offset of each frame
  outside JAX, which a transposed equation keeps, with its shape and dtype: `forward_at`; the
  forward equations `jax.checkpoint` recomputes there are primal values, not cotangents); a
  sum over the axis (psum, pmean, psum_scatter) completes it.

`unchecked_violations` reports SPMD410 for an output whose out_spec is replicated over an
axis of its `unsummed`, SPMD411 for an output with a `scaled` axis, SPMD412 for a gradient
(`gradients.read`) `partial` over an axis over which all its primals vary (a parameter
sharded over it: no later sum can mend it; a replicated one's is SPMD410's case). Not
reported here: a value that varies for another reason under a replicated out_spec (the checked trace's warnings
say it: `typed_shard_map(check_vma=False)`), a gradient summed twice by the user (its checked
trace's SPMD103), the scale of a loss (a psum of per-device gradients is the gradient of the
summed loss: right or n times the mean's, as the loss was meant). A gradient taken outside
the shard_map is right: JAX divides the cotangent of a replicated output by n before the
body's transpose, whose equations are no gradient the body computed (nothing to walk).
Each value's `varying` is also kept (`UncheckedWalk.types`): the states the refinement walk
reads for the program (`refine_walk.check_unchecked`: a bias added before the psum, wrong
with the checks on or off), since JAX typed every value Invariant.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _compat, _rules, _surface
from .._errors import SpmdTypeError, error
from .._frames import is_library, library_frames, package_call_site
from .._rules import V
from .eqns import EqnView, Views
from .gradients import is_backward, is_forward, is_recomputed, read, shape_key
from .refine_facts import eqn_axes, is_literal
from .walk import call_site, collective_api, user_frame

#: what a collective's result holds on each device, where JAX's typing with the checks on says
#: less: an all_gather's result is the same on every device (typed Varying)
_HOLDS = {"all_gather": "all_gather_invarying"}
#: the APIs whose call names where a gradient was taken (`call_site`)
_GRAD_APIS = ("grad", "vjp")
#: iterations of a loop's fixed point before every carry is taken to differ everywhere
_MAX_ITERATIONS = 16


@dataclasses.dataclass(frozen=True)
class Taken:
    """Where a gradient was taken: the user's line that used the replicated primal (`used`)
    and the line that called `jax.grad` / `jax.value_and_grad` / a library's (`called`)."""

    used: tuple[str, int] | None
    called: tuple[str, int] | None
    #: the collective the user called there (SPMD411: the one whose transpose sums twice)
    op: str = ""

    @property
    def line(self) -> tuple[str, int] | None:
        return self.called or self.used


#: axis -> where: one `Facts` field's entries, sorted by axis
Marks = tuple[tuple[str, Taken], ...]


def _merged(a: Marks, b: Marks) -> Marks:
    if not b or a == b:
        return a
    seen = dict(a)
    for axis, taken in b:
        seen.setdefault(axis, taken)
    return tuple(sorted(seen.items()))


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the walk knows of one value of the program that runs."""

    varying: frozenset[str] = frozenset()
    #: axis -> where its gradient, left unsummed over the axis, was taken (SPMD410)
    unsummed: Marks = ()
    #: axis -> the psum whose transpose summed equal cotangents over the axis (SPMD411)
    scaled: Marks = ()
    #: axis -> the forward line whose cotangent the backward pass left a partial sum over the
    #: axis: a value replicated over it met per-device data there (SPMD412)
    partial: Marks = ()

    def join(self, other: Facts) -> Facts:
        if other is self or other == _SAME:
            return self
        if self == _SAME:
            return other
        return Facts(self.varying | other.varying, _merged(self.unsummed, other.unsummed),
                     _merged(self.scaled, other.scaled), _merged(self.partial, other.partial))


_SAME = Facts()


def _join(facts: Sequence[Facts]) -> Facts:
    out = _SAME
    for f in facts:
        out = out.join(f)
    return out


def _jaxpr_of(j: Any) -> Any:
    return getattr(j, "jaxpr", j)


class UncheckedWalk:
    """The facts of a `check_vma=False` body's values (see the module docstring)."""

    def __init__(self, manual: Sequence[str]) -> None:
        self.manual = frozenset(manual)
        self.views = Views()
        #: (call site, shape, dtype) -> the axes over which an operand of a forward equation
        #: of a gradient bound at that call site (`_site`), of that shape and dtype, may
        #: differ: what a backward equation transposing it is the cotangent of
        self.forward_at: dict[tuple[Any, ...], frozenset[str]] = {}
        self._sites: dict[int, tuple[tuple[str, int, int], ...] | None] = {}
        self._user_at: dict[int, tuple[int, ...]] = {}
        #: walking the jaxprs an equation of a gradient's forward pass holds (a scan of
        #: layers: its body's equations carry no `jvp` of their own)
        self._in_forward = False
        #: SPMD412: (axis, where the partial cotangent arose) of each gradient of a primal
        #: that differs over the axis, computed from a cotangent partial over it
        self.partial_gradients: dict[tuple[str, Taken], None] = {}
        #: each value's manual axes of `Facts.varying` (the last walk of a loop's body: its
        #: fixed point), the states the refinement walk reads for the program
        #: (`refine_walk.check_unchecked`)
        self.types: dict[Any, frozenset[str]] = {}

    def jaxpr(self, jaxpr: Any, ins: Sequence[Facts], backward: bool = False) -> list[Facts]:
        """The facts of `jaxpr`'s outputs; `backward`: it is nested in an equation of a
        gradient's backward pass (JAX names the transposition on that equation, not on the
        equations of the jaxpr it holds: a transposed scan's body)."""
        env: dict[Any, Facts] = dict(zip(jaxpr.invars, ins, strict=True))
        types = self.types
        for v, f in env.items():
            types[v] = f.varying
        views = self.views.all(jaxpr)
        links = read(views, jaxpr.outvars).links
        producer: dict[Any, EqnView] = {}

        def get(v: Any) -> Facts:
            return _SAME if is_literal(v) else env.get(v, _SAME)

        for view in views:
            inside = backward or is_backward(view.eqn)
            ins = [get(v) for v in view.eqn.invars]
            outer = self._in_forward
            forward = not inside and (outer or is_forward(view))
            if forward:
                self._forward(view, ins)
            self._in_forward = forward
            outs = self.eqn(view, ins, inside)
            self._in_forward = outer
            for v, f in zip(view.eqn.outvars, outs, strict=True):
                if inside:
                    producer[v] = view
                    f = self._cotangent(view, v, f)
                primals = links.get(v)
                if primals is not None:
                    f = self._gradient(v, f, [get(p) for p in primals], producer)
                env[v] = f
                types[v] = f.varying
        return [get(v) for v in jaxpr.outvars]

    def _forward(self, view: EqnView, ins: Sequence[Facts]) -> None:
        """Note the operands of a forward equation of a gradient (`forward_at`)."""
        site = self._site(view)
        if site is None:
            return
        for v, f in zip(view.eqn.invars, ins, strict=True):
            if not is_literal(v):
                key = (site, *shape_key(v))
                self.forward_at[key] = self.forward_at.get(key, frozenset()) | f.varying

    def _site(self, view: EqnView) -> tuple[tuple[str, int, int], ...] | None:
        """The calls that bound the equation: file, line and bytecode offset of each frame
        outside JAX and the standard library (a transposed equation keeps its forward
        equation's stack; two calls on one line differ, and so do two calls of one library
        function: every `eqx.nn.Linear` multiplies at one line of equinox's)."""
        if id(view) in self._sites:
            return self._sites[id(view)]
        frames = view.frames   # (one tuple per stack: equal equations share it)
        at = self._user_at.get(id(frames))
        if at is None:
            at = self._user_at[id(frames)] = tuple(
                i for i, (f, _n, _fn) in enumerate(frames) if not is_library(f))
        lastis = _compat.eqn_lastis(view.eqn)
        site = tuple((*frames[i][:2], lastis[i]) for i in at if i < len(lastis)) or None
        self._sites[id(view)] = site
        return site

    def _cotangent(self, view: EqnView, v: Any, f: Facts) -> Facts:
        """`f` of `v`, a value of the backward pass: partial over the axes over which it
        varies and none of the forward operands it may be the cotangent of does (with the
        checks on, the transpose of the pvary where the replicated value met per-device data
        would sum it; a copy-to-tensor-parallel region does so by hand)."""
        if not f.varying:
            return f
        site = self._site(view)
        primal = None if site is None else self.forward_at.get((site, *shape_key(v)))
        if primal is None:
            return f
        missing = f.varying - primal - {a for a, _ in f.partial}
        if not missing or is_recomputed(view):
            return f
        taken = _taken_at(view.frames)
        return dataclasses.replace(
            f, partial=_merged(f.partial, tuple((a, taken) for a in sorted(missing))))

    def _gradient(self, v: Any, f: Facts, primals: Sequence[Facts],
                  producer: dict[Any, EqnView]) -> Facts:
        """The gradient `v` of `primals`: unsummed over the axes it varies over and none of
        its primals does; computed from a partial cotangent over an axis all its primals
        differ over (a parameter sharded over it: no later sum can mend it), SPMD412."""
        for a, taken in f.partial:
            if all(a in p.varying for p in primals):
                self.partial_gradients[(a, taken)] = None
        missing = f.varying - frozenset().union(*(p.varying for p in primals))
        if not missing:
            return f
        taken = _taken(v, producer)
        return dataclasses.replace(
            f, unsummed=_merged(f.unsummed, tuple((a, taken) for a in sorted(missing))))

    def eqn(self, view: EqnView, ins: Sequence[Facts], backward: bool) -> list[Facts]:
        eqn, name = view.eqn, view.name
        n = len(eqn.outvars)
        row = _surface.axis_primitive(name)
        if row is not None:
            return self._collective(eqn, name, row, ins, backward)
        if name == "axis_index":
            return [Facts(frozenset(eqn_axes(eqn)) & self.manual)] * n
        if name == "cond":
            return self._cond(eqn, ins, backward)
        if name == "while":
            return self._while(eqn, ins, backward)
        if name == "scan":
            return self._scan(eqn, ins, backward)
        if name != "shard_map":
            sub = next((s for s in map(_jaxpr_of, view.subs) if len(s.invars) == len(ins)
                        and len(s.outvars) == n), None)
            if sub is not None:   # jit, remat, custom_jvp / custom_vjp calls
                return self.jaxpr(sub, ins, backward)
        return [_join(ins)] * n

    def _collective(self, eqn: Any, name: str, row_name: str, ins: Sequence[Facts],
                    backward: bool) -> list[Facts]:
        row = _rules.AXIS_OPS[_HOLDS.get(name, row_name)]
        axes = frozenset(eqn_axes(eqn)) & self.manual
        # a reduction within groups of devices leaves the groups' results different
        grouped = eqn.params.get("axis_index_groups") is not None
        ends = frozenset() if grouped or row.on.get(V) is not _rules.I else axes
        pairs = list(zip(ins, eqn.outvars, strict=True)) if len(ins) == len(eqn.outvars) \
            else [(_join(ins), v) for v in eqn.outvars]
        # the transpose of a psum in a gradient's backward pass is a psum (with the checks on,
        # a pvary): of a cotangent equal on every device, n times it (a pmean divides first)
        mean = any("pmean" in fn for _f, fn in library_frames(_compat.eqn_frames(eqn)))
        sums_twice = row.unreduced_kind == "sum" and not grouped and backward and not mean
        # a pmean over the axis divides what a psum'd loss's transpose multiplied (jax#3970:
        # psum the loss, pmean its gradient: the n cancels)
        unscaled = axes if mean and not backward and not grouped else frozenset()
        # a sum over the axis (psum, pmean, psum_scatter) completes a partial cotangent
        completes = axes if row.unreduced_kind == "sum" and not grouped else frozenset()
        out = []
        for f, _v in pairs:
            varying = f.varying - ends
            for a in axes - ends:
                got = row.on.get(V) if a in f.varying else row.jax_on.get(_rules.I, row.on.get(_rules.I))
                if got is not _rules.I:
                    varying |= {a}
            scaled = tuple((a, t) for a, t in f.scaled if a not in unscaled)
            equal = sorted(axes - f.varying) if sums_twice else ()
            if equal:
                frames = _compat.eqn_frames(eqn)
                taken = dataclasses.replace(_taken_at(frames),
                                            op=collective_api(frames, _rules.AXIS_OPS[row_name].jax_name))
                scaled = _merged(scaled, tuple((a, taken) for a in equal))
            out.append(Facts(varying, tuple((a, t) for a, t in f.unsummed if a not in ends),
                             scaled, tuple((a, t) for a, t in f.partial if a not in completes)))
        return out

    def _cond(self, eqn: Any, ins: Sequence[Facts], backward: bool) -> list[Facts]:
        pred, ops = ins[0], list(ins[1:])
        outs: list[Facts] | None = None
        for br in eqn.params["branches"]:
            res = self.jaxpr(_jaxpr_of(br), ops, backward)
            outs = res if outs is None else [a.join(b) for a, b in zip(outs, res, strict=True)]
        return [_varying_also(f, pred.varying) for f in outs or []]

    def _while(self, eqn: Any, ins: Sequence[Facts], backward: bool) -> list[Facts]:
        p = eqn.params
        nc, nb = int(p["cond_nconsts"]), int(p["body_nconsts"])
        cj, bj = _jaxpr_of(p["cond_jaxpr"]), _jaxpr_of(p["body_jaxpr"])
        cconsts, bconsts, carry = list(ins[:nc]), list(ins[nc:nc + nb]), list(ins[nc + nb:])
        for _ in range(_MAX_ITERATIONS):
            pred = self.jaxpr(cj, cconsts + carry, backward)[0]
            res = self.jaxpr(bj, bconsts + carry, backward)
            new = [_varying_also(c.join(r), pred.varying) for c, r in zip(carry, res, strict=True)]
            if new == carry:
                return carry
            carry = new
        return [_varying_also(c, self.manual) for c in carry]

    def _scan(self, eqn: Any, ins: Sequence[Facts], backward: bool) -> list[Facts]:
        nconsts, ncarry = _compat.scan_counts(eqn)
        body = _jaxpr_of(eqn.params["jaxpr"])
        consts, carry = list(ins[:nconsts]), list(ins[nconsts:nconsts + ncarry])
        xs = list(ins[nconsts + ncarry:])
        for _ in range(_MAX_ITERATIONS):
            res = self.jaxpr(body, consts + carry + xs, backward)
            new = [c.join(r) for c, r in zip(carry, res[:ncarry], strict=True)]
            if new == carry:
                return carry + res[ncarry:]
            carry = new
        carry = [_varying_also(c, self.manual) for c in carry]
        return carry + self.jaxpr(body, consts + carry + xs, backward)[ncarry:]


def _varying_also(f: Facts, axes: frozenset[str]) -> Facts:
    """`f`, differing between devices over `axes` as well (its marks kept)."""
    return f if axes <= f.varying else dataclasses.replace(f, varying=f.varying | axes)


def _taken(v: Any, producer: dict[Any, EqnView]) -> Taken:
    """Where the gradient `v` was taken: the first equation of the backward pass that defines
    it (through the `add_any` that sums several uses' contributions) with a user frame."""
    seen = 0
    todo = [v]
    while todo and seen < 64:
        seen += 1
        view = producer.get(todo.pop(0))
        if view is None:
            continue
        taken = _taken_at(view.frames)
        if taken.used is not None:
            return taken
        todo.extend(u for u in view.eqn.invars if not is_literal(u))
    return Taken(None, None)


def _taken_at(frames: Sequence[tuple[str, int, str]]) -> Taken:
    """The user's line of a backward equation (its forward equation's) and the line that
    called the gradient's API, from its Python stack."""
    used = user_frame(frames)
    if used is None:
        return Taken(None, None)
    inside = package_call_site(frames, used)   # (eqx.nn.Linear's matmul: the model's call)
    if inside is not None:
        used = inside[:2]
    return Taken(used, next((c for c in (call_site(frames, api) for api in _GRAD_APIS)
                             if c is not None), None))


def _spec_axes(spec: Any) -> frozenset[str]:
    return frozenset(_compat.spec_parts(spec)[0]) if spec is not None else frozenset()


def output_facts(eqn: Any, manual: Sequence[str]) -> list[Facts]:
    """The facts of each output of the shard_map equation `eqn` (its body walked from its
    in_specs), whichever `check_vma` it was traced with."""
    return _walked(eqn, manual)[1]


def _walked(eqn: Any, manual: Sequence[str]) -> tuple[UncheckedWalk, list[Facts]]:
    ins = [Facts(_spec_axes(s) & frozenset(manual)) for s in eqn.params["in_specs"]]
    walk = UncheckedWalk(manual)
    return walk, walk.jaxpr(_jaxpr_of(eqn.params["jaxpr"]), ins)


Located = list[tuple[SpmdTypeError, "tuple[str, int] | None"]]


def unchecked_violations(eqn: Any, manual: Sequence[str], where: str
                         ) -> tuple[Located, Located, dict[Any, frozenset[str]]]:
    """The violations of the `check_vma=False` shard_map equation `eqn` (see the module
    docstring), each with the line it is reported at: SPMD410 for an output whose out_spec is
    replicated over an axis of its `unsummed`, SPMD411 for an output with a `scaled` axis
    (wrong on every device, whatever its out_spec); one per axis and line; SPMD412 for a
    gradient computed from a partial cotangent (`UncheckedWalk.partial_gradients`), at the
    forward line where the replicated value met the sharded weights. Then the notes: an
    output that differs between devices for another reason under an out_spec replicated
    over the axis (SPMD401, what JAX rejects with the checks on), at the line that computed
    it; a face warns them (code written for check_vma=False may return one device's value
    on purpose). Last, each value's axes of variation (`UncheckedWalk.types`)."""
    manual_set = frozenset(manual)
    walk, outs = _walked(eqn, manual)
    inner = _jaxpr_of(eqn.params["jaxpr"])
    found: Located = []
    notes: Located = []
    reported: set[tuple[str, str, Taken]] = set()
    # a shard_map autodiff staged (the forward of `jax.grad` of a shard-mapped function) has
    # JAX's residuals among its outputs: its output indices are not the user's
    staged = bool(_compat.eqn_transforms(eqn))
    for i, (f, spec) in enumerate(zip(outs, eqn.params["out_specs"], strict=True)):
        name = "an output" if staged else f"output leaf {i}"
        out = (f"{name} (out_specs {_rules.spec_text(spec)})" + (
            " of the shard_map as autodiff staged it (the forward of jax.grad: JAX's residuals "
            "are outputs too)" if staged else ""))
        replicated = manual_set - _spec_axes(spec)
        differs = sorted((f.varying & replicated) - {a for a, _ in f.unsummed})
        if differs:
            notes.append((_varies(differs, out), _defined_at(inner, inner.outvars[i])))
        for code, marks in (("SPMD411", f.scaled), ("SPMD410", f.unsummed)):
            for axis, taken in marks:
                if (code == "SPMD410" and axis not in replicated) or (code, axis, taken) in reported:
                    continue
                reported.add((code, axis, taken))
                build = _twice if code == "SPMD411" else _unsummed
                found.append((build(axis, taken, name, out, where),
                              taken.used if code == "SPMD411" else taken.line))
    for axis, taken in walk.partial_gradients:
        found.append((_partial(axis, taken), taken.used))
    return found, notes, walk.types


def _defined_at(jaxpr: Any, v: Any) -> tuple[str, int] | None:
    """The user's line of the equation of `jaxpr` that defines `v` (None for an input)."""
    for e in jaxpr.eqns:
        if v in e.outvars:
            return user_frame(_compat.eqn_frames(e))
    return None


def _varies(axes: Sequence[str], out: str) -> SpmdTypeError:
    a = ", ".join(map(repr, axes))
    return error(
        "SPMD401",
        f"JAX rejects {out}: it differs between "
        f"devices over {a}, and check_vma=False returns one device's",
        axes=tuple(axes), op="shard_map",
        fix=(f"jax.lax.pmean(x, {a}) before returning it (psum for a sum), or an out_spec "
             f"naming {a} to keep one per device"))


def _unsummed(axis: str, taken: Taken, name: str, out: str, where: str) -> SpmdTypeError:
    a = repr(axis)
    details = []
    if taken.used is not None and taken.used != taken.line:
        details.append(f"the replicated value meets per-device data at "
                       f"{taken.used[0]}:{taken.used[1]}")
    details.append(f"{where}: {out} carries it")
    return error(
        "SPMD410",
        f"gradient never summed over {a} under check_vma=False: each device keeps its own "
        f"partial gradient, and {name}, replicated over {a}, returns one device's",
        axes=(axis,), op="jax.grad", details=tuple(details),
        fix=(f"grads = jax.lax.pmean(grads, {a}) right after the gradient (psum if the loss "
             f"is a sum over the devices' batches), before any update; or check_vma=True, "
             f"where JAX sums it in the backward pass (then drop an explicit pmean of the "
             f"gradient: SPMD103)"))


def _called(taken: Taken) -> list[str]:
    """The detail naming the line that took the gradient, where it is known."""
    return [] if taken.called is None else \
        [f"the gradient taken at {taken.called[0]}:{taken.called[1]}"]


def _partial(axis: str, taken: Taken) -> SpmdTypeError:
    a = repr(axis)
    details = _called(taken)
    return error(
        "SPMD412",
        f"cotangent left partial over {a} under check_vma=False: a value replicated over {a} "
        f"meets per-device weights here, the backward pass leaves each device a partial sum "
        f"of its cotangent, and the gradient of a parameter sharded over {a} is computed "
        f"from it",
        axes=(axis,), op="jax.grad", details=tuple(details),
        fix=(f"pass the replicated value through Megatron's copy-to-tensor-parallel region "
             f"before it meets the sharded weights: a jax.custom_vjp, identity forward, "
             f"jax.lax.psum(ct, {a}) backward; or check_vma=True, where JAX sums that "
             f"cotangent itself"))


def _twice(axis: str, taken: Taken, name: str, out: str, where: str) -> SpmdTypeError:
    a = repr(axis)
    details = _called(taken)
    details.append(f"{where}: {out} carries it")
    return error(
        "SPMD411",
        f"{taken.op} over {a} differentiated under check_vma=False: its transpose sums a "
        f"cotangent equal on every device, so the gradient is {a}'s size times too large",
        axes=(axis,), op=taken.op, details=tuple(details),
        fix=(f"check_vma=True (JAX transposes the psum to a pvary: no second sum), or a "
             f"psum whose backward pass is the identity (jax.custom_vjp, Megatron's "
             f"reduce-from-tensor-parallel region), or take the gradient outside the "
             f"shard_map (jax.grad of the shard-mapped function); jax.lax.pmean over {a} "
             f"if the mean was meant"))

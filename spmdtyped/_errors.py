"""The error hierarchy, the code registry and message rendering.

Imports no JAX: the mypy plugin renders the same headlines as the runtime.  Every
``SPMD###`` code lives in ``REGISTRY`` once; the exception classes, ``st.explain``, the
docs' error catalogue and the plugin's ``spmd-<slug>`` error codes are all read from it.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterable, Iterator, Mapping

DOCS_URL = "https://spmdtyped.readthedocs.io/en/latest/errors/"


class SpmdTypeError(TypeError):
    """Root of every spmdtyped error: a manual-axis state mistake or bad input to spmdtyped.

    **Attributes:**

    - `code`: the `"SPMD###"` code; `st.explain(code)` prints its page.
    - `axes`: the offending mesh axes, in the order they were named.
    - `states`: `{axis: state}` of the offending value ("invariant", "varying", ...).
    - `fix`: a suggested fix as code, or `None`.
    - `op`: the spmdtyped API that raised it, or `None`.
    - `headline`: the first line of the message (what the mypy plugin prints too).
    """

    code: str = "SPMD000"

    def __init__(
        self,
        headline: str,
        *,
        code: str | None = None,
        axes: Iterable[str] = (),
        states: Mapping[str, str] | None = None,
        fix: str | None = None,
        op: str | None = None,
        details: Iterable[str] = (),
    ) -> None:
        if code is not None:
            self.code = code
        self.headline = headline
        self.axes = tuple(axes)
        self.states = dict(states or {})
        self.fix = fix
        self.op = op
        self.details = tuple(details)
        super().__init__(render(self))


class AxisStateError(SpmdTypeError):
    """A collective was given a value whose state on a named axis it cannot take (SPMD1xx)."""


class CombineError(SpmdTypeError):
    """Operands of an elementwise op, matmul or reduction have states that do not combine (SPMD2xx)."""


class CastError(SpmdTypeError):
    """`pcast`/`pvary` asked for a state change no cast can make (SPMD3xx)."""


class BoundaryError(SpmdTypeError):
    """`in_specs`/`out_specs` do not fit the function's values (SPMD4xx)."""


class UsageError(SpmdTypeError):
    """Bad input to spmdtyped: unknown axis, malformed hint, call outside shard_map (SPMD5xx)."""


class InternalConsistencyError(SpmdTypeError):
    """spmdtyped predicted a different state than JAX computed: a bug in the rule table (SPMD9xx)."""


for _cls in (SpmdTypeError, AxisStateError, CombineError, CastError, BoundaryError, UsageError,
             InternalConsistencyError):
    _cls.__module__ = "spmdtyped"


@dataclasses.dataclass(frozen=True)
class ErrorInfo:
    """One page of the error catalogue."""

    code: str
    slug: str  # the mypy plugin reports it as ``spmd-<slug>``
    category: type[SpmdTypeError]
    title: str
    meaning: str
    solutions: tuple[str, ...]
    before: str
    after: str
    when: str
    related: tuple[str, ...] = ()
    strict: bool = False  # JAX accepts this (and is wrong); `st.allow(code)` opts out

    @property
    def mypy_code(self) -> str:
        return f"spmd-{self.slug}"


def _info(*args: object, **kwargs: object) -> ErrorInfo:
    return ErrorInfo(*args, **kwargs)  # type: ignore[arg-type]


REGISTRY: dict[str, ErrorInfo] = {
    e.code: e
    for e in [
        _info(
            "SPMD101", "reduced-operand", AxisStateError,
            "an axis collective was given a value that is Reduced on that axis",
            "A Reduced value is already the result of a reduction over the axis: it is replicated, "
            "and its gradient is Unreduced. Summing, gathering or permuting it over the same axis "
            "would communicate a value that is not per-device. JAX reports this as `psum cannot "
            "accept args which are reduced` (or `pvary cannot accept args which are reduced`).",
            (
                "Cast it back to a per-device value first: `st.pcast(x, axis, to=\"varying\")`.",
                "Use the value from before the reduction (the Varying value you all-gathered or "
                "summed).",
                "If a custom primitive produced the Reduced value, declare its effects with "
                "`st.custom_op` so the right state is recorded.",
            ),
            'w = st.all_gather(w_shard, "dp", to="reduced")\ny = st.psum(w, "dp")',
            'w = st.all_gather(w_shard, "dp", to="reduced")\n'
            'y = st.psum(st.pcast(w, "dp", to="varying"), "dp")',
            "psum/pmean/pmax/pmin/ppermute/pshuffle/all_gather/psum_scatter/all_to_all over an "
            "axis where the input is Reduced: typically a ZeRO/FSDP parameter gathered with "
            "`all_gather(to=\"reduced\")` or declared `P(reduced=...)`, then reduced again.",
            ("SPMD102", "SPMD103", "SPMD301"),
        ),
        _info(
            "SPMD102", "unreduced-operand", AxisStateError,
            "an axis collective that does not reduce was given a value that is Unreduced on that axis",
            "An Unreduced value holds partial results whose true value is their sum over the axis. "
            "Only a reduction (`psum`, `pmean`, `psum_scatter`; `pmax`/`pmin` for the max/min kind) "
            "can consume it; permuting or gathering partial sums is almost always a mistake.",
            (
                "Reduce it first: `st.psum(x, axis)` or, to keep it sharded, "
                "`st.psum_scatter(x, axis, tiled=True)`.",
            ),
            'g = st.all_gather(partial, "tp")',
            'g = st.all_gather(st.psum_scatter(partial, "tp", tiled=True), "tp", tiled=True)',
            "ppermute/all_gather/all_to_all (or pmax/pmin of a sum-kind value) over an axis where "
            "the input is Unreduced, e.g. the output of a row-parallel matmul declared unreduced.",
            ("SPMD101", "SPMD106"),
        ),
        _info(
            "SPMD103", "invariant-operand", AxisStateError,
            "an axis collective was given a value that is already Invariant on that axis",
            "An Invariant value is identical on every device of the axis. JAX silently `pvary`s it "
            "first, so `psum` returns n·x (a double sum), `pmean` of already-summed gradients is a "
            "no-op that hides a bug, and a ppermute/all_gather moves identical data. spmdtyped "
            "rejects it: say explicitly that you want a per-device copy.",
            (
                "Drop the collective if the value is already reduced (the common double-psum bug).",
                "If you really want n·x, say so: `st.psum(st.pvary(x, axis), axis)` "
                "(or `x * st.axis_size(axis)`).",
                "One-line opt-out for a block of code: `with st.allow(\"SPMD103\"): ...`.",
            ),
            'g = st.psum(loss_grad, "dp")   # already psum\'d by jax.grad',
            "g = loss_grad                   # the gradient is already Invariant over dp",
            "A second psum/pmean of a value that was already reduced; gradients of Invariant "
            "parameters (jax.grad already sums them over the axis); a collective over an axis the "
            "input is not sharded on.",
            ("SPMD104",),
            True,
        ),
        _info(
            "SPMD104", "mixed-states", AxisStateError,
            "a collective over several axes was given a value whose state differs between those axes",
            "A call over a tuple of axes needs the value in one state on all of them: JAX raises "
            "`psum can only accept axis_name which corresponds to one of varying, unreduced, reduced "
            "or invarying state of the input` for psum/psum_scatter/pcast, and for ppermute or "
            "all_gather it silently pvarys the Invariant axes.",
            (
                "Split the call per axis state, or cast the lagging axes first: "
                "`st.pvary(x, \"tp\")` turns Invariant into Varying.",
            ),
            'y = st.psum(x, ("dp", "tp"))     # x: Varying["dp"]',
            'y = st.psum(x, "dp")             # x is Invariant over tp already',
            "Tuple axis names where the value is Varying on some axes and Invariant or Unreduced "
            "on others.",
            ("SPMD103", "SPMD101"),
        ),
        _info(
            "SPMD105", "pmean-denominator", AxisStateError,
            "pmean of a value that is Unreduced or Reduced on another axis",
            "`pmean` divides by the axis size, a replicated constant; JAX cannot divide a value that "
            "is Unreduced or Reduced on some other axis by it (`Inputs cannot be replicated...` or "
            "`unreduced rule for div`).",
            (
                "Reduce the other axis first, or use `st.psum(x, axis) / st.axis_size(axis)` on a "
                "value whose other axes are Varying or Invariant.",
            ),
            'm = st.pmean(x, "dp")             # x: Typed[Varying["dp"], Unreduced["tp"]]',
            'm = st.pmean(st.psum(x, "tp"), "dp")',
            "Averaging over one axis a value that still has pending partial sums or a reduced "
            "marker on another axis.",
            ("SPMD201", "SPMD203"),
        ),
        _info(
            "SPMD106", "unreduced-kind", AxisStateError,
            "a reduction of the wrong kind was applied to an Unreduced value",
            "Since jax 0.12 an Unreduced value records which reduction is pending (sum, max or "
            "min). `psum` completes a sum, `pmax`/`pmin` a max/min; any other combination would "
            "compute the wrong value.",
            ("Use the reduction that matches the pending kind.",),
            'y = st.pmax(partial_sums, "tp")',
            'y = st.psum(partial_sums, "tp")',
            "pmax/pmin on a sum-kind Unreduced value (always the case on jax 0.10), psum on a "
            "max/min-kind value.",
            ("SPMD102",),
        ),
        _info(
            "SPMD107", "custom-op-requires", AxisStateError,
            "a custom op was given a value whose state differs from its declared `requires`",
            "`st.custom_op(requires=...)` declares the state each input must have on each axis, as "
            "a collective does: a custom all-reduce needs Varying input, a kernel consuming partial "
            "sums needs Unreduced input. Calling it on a value in another state would run the "
            "kernel on data it does not expect (JAX cannot check opaque kernels, callbacks or FFI "
            "calls at all).",
            (
                "Cast the argument: `st.pvary(x, axis)` (Invariant -> Varying), `st.pcast(x, axis, "
                "to=\"varying\")` (Reduced -> Varying).",
                "Reduce it first if it is Unreduced: `st.psum(x, axis)`.",
                "If the declaration is too strict, fix `requires=` (one `{axis: state}` for every "
                "argument, or `{parameter: {axis: state}}`).",
            ),
            '@st.custom_op(requires={"tp": "varying"}, produces={"tp": "invariant"})\n'
            "def my_allreduce(x): ...\n"
            "y = my_allreduce(w)                  # w: Invariant",
            'y = my_allreduce(st.pvary(w, "tp"))',
            "Custom collectives, Pallas/FFI kernels and callbacks wrapped with `st.custom_op`, "
            "called on a value that is Invariant, Reduced or Unreduced where the declaration "
            "wants another state.",
            ("SPMD103", "SPMD507", "SPMD902"),
        ),
        _info(
            "SPMD201", "unreduced-mismatch", CombineError,
            "an Unreduced value was combined with a value that is not Unreduced on the same axes",
            "Σ_d a_d + b is not Σ_d (a_d + b): adding a non-partial value to partial sums would count "
            "it once per device. Unreduced combines only linearly: U + U on the same axes, U × R "
            "(or U / R) with R reduced on exactly those axes.",
            (
                "Reduce first: `st.psum(u, axis) + b`.",
                "Scale with a Reduced factor: `u * st.pcast(c, axis, to=\"reduced\")` "
                "(Python scalars are cast for you).",
            ),
            "y = u + bias",
            'y = st.psum(u, "tp") + bias',
            "Adding a bias to the output of a row-parallel matmul before its psum; multiplying two "
            "Unreduced values; adding a constant to an Unreduced value.",
            ("SPMD202", "SPMD205"),
        ),
        _info(
            "SPMD202", "nonlinear-unreduced", CombineError,
            "an operation not declared linear was applied to an Unreduced value",
            "f(Σ_d x_d) ≠ Σ_d f(x_d) unless f is linear. JAX rejects most non-linear ops on "
            "Unreduced values, but silently drops the state through `cumsum`, `**`, `where`, "
            "`flip`, `argmax`, `.at[].set` and more, returning wrong numbers typed Invariant.",
            (
                "Reduce first: `f(st.psum(u, axis))`.",
                "For an op that is linear but not in the table, declare it with `st.custom_op`.",
                "One-line opt-out (JAX's unsound behaviour): `with st.allow(\"SPMD202\"): ...`.",
            ),
            "y = st.numpy.tanh(u)",
            'y = st.numpy.tanh(st.psum(u, "tp"))',
            "An activation, comparison, power, cumulative op or indexing update applied to partial "
            "sums (the output of a row-parallel matmul or of `pcast(to=\"unreduced\")`).",
            ("SPMD201",),
            True,
        ),
        _info(
            "SPMD203", "reduced-replicated", CombineError,
            "a Reduced value was combined with a value that is Invariant on its reduced axes",
            "JAX requires every operand of an op with a Reduced input to be Varying, Unreduced or "
            "Reduced on those axes (`Inputs cannot be replicated on the same axes that another input "
            "is reduced on`): the cotangent of the Invariant operand would otherwise be summed "
            "implicitly. Python scalars are cast for you; arrays are not.",
            (
                "Make the other operand Reduced too: `st.pcast(c, axis, to=\"reduced\")`.",
                "Or make the Reduced operand Varying: `st.pcast(r, axis, to=\"varying\")`.",
            ),
            "y = w * scale          # w: Reduced['dp'], scale: Invariant array",
            'y = w * st.pcast(scale, "dp", to="reduced")',
            "Multiplying a ZeRO parameter by an Invariant array, adding an Invariant bias to it, "
            "or combining it with a value Varying on a different axis.",
            ("SPMD204", "SPMD205"),
        ),
        _info(
            "SPMD204", "reduced-mismatch", CombineError,
            "operands are Reduced on different axes",
            "All Reduced operands of one op must be reduced over the same axes (JAX: `All inputs "
            "should be reduced across the same mesh axes`).",
            ("Cast one side: `st.pcast(x, axis, to=\"varying\")` on the axes it alone is reduced on.",),
            "y = a + b              # a: Reduced['dp'], b: Reduced['tp']",
            'y = st.pcast(a, "dp", to="varying") + b',
            "Combining parameters sharded for ZeRO over different mesh axes.",
            ("SPMD203",),
        ),
        _info(
            "SPMD205", "partial-cast", CombineError,
            "an operand would need a cast out of Unreduced or Reduced on part of the other operand's varying axes",
            "JAX makes operands agree on their varying axes by casting: Invariant → Varying (pvary) "
            "on the missing axes, or Reduced → Varying when the Reduced axes are exactly the "
            "missing ones. No cast exists out of Unreduced, and JAX has no partial Reduced → "
            "Varying cast (`pvary cannot accept args which are unreduced/reduced`).",
            (
                "Cast the Reduced operand yourself on its reduced axes: `st.pcast(r, axis, "
                "to=\"varying\")`.",
                "Reduce the Unreduced operand first: `st.psum(u, axis)`.",
            ),
            'y = x + w              # x: Varying["dp", "tp"], w: Reduced["dp"]',
            'y = x + st.pcast(w, "dp", to="varying")',
            "V:(dp,tp) + R:dp; U:tp + V:tp; matmul of a value Varying on more axes than a Reduced "
            "parameter is reduced on.",
            ("SPMD201", "SPMD203"),
        ),
        _info(
            "SPMD301", "unsupported-cast", CastError,
            "pcast/pvary cannot make this state change",
            "The free casts are Invariant → Varying, Reduced → Varying, Invariant → Reduced and "
            "Varying → Unreduced. Nothing casts out of Unreduced or into Invariant: those need a "
            "collective that communicates (psum, all_gather(to=\"invarying\")). JAX raises "
            "`Unsupported pcast from=..., to=...`; note that `pcast(to=\"varying\")` of a Varying "
            "value is an error, not a no-op.",
            (
                "Drop the cast if the value already has the target state.",
                "Use a collective for a change that communicates: `st.psum` (Varying/Unreduced → "
                "Invariant), `st.all_gather(..., to=\"reduced\")` (Varying → Reduced).",
            ),
            'x = st.pcast(x, "dp", to="varying")   # x already Varying on dp',
            "x = x",
            "Casting twice, casting Invariant straight to Unreduced (go through Varying), or "
            "casting Varying to Reduced.",
            ("SPMD101", "SPMD102"),
        ),
        _info(
            "SPMD302", "carry-state", CastError,
            "a loop carry or branch output changes state in a way no free cast can fix",
            "A loop carry has one state on every iteration, and each output of cond/switch one "
            "state in every branch. spmdtyped joins differing states with the free casts that keep "
            "the value (Invariant -> Varying, Invariant -> Reduced, Reduced -> Varying), casting "
            "the initial carry or a branch's output and retracing. Nothing casts into or out of "
            "Unreduced without changing what the value means, so a carry that is Unreduced on one "
            "side only, or Unreduced under a loop condition or branch predicate that varies across "
            "devices, cannot be joined. JAX reports these as `scan body function carry input and "
            "carry output must have equal types` or `cond branches must have equal output types`.",
            (
                "Keep the carry Unreduced through the loop and reduce after it: "
                "`st.psum(st.fori_loop(...), axis)`.",
                "Start an Unreduced accumulator Unreduced: `st.pcast(st.pvary(jnp.zeros(shape), "
                "axis), axis, to=\"unreduced\")` (zero is a valid partial sum).",
                "Make a varying predicate Invariant first (`st.pmax(pred, axis)`) if every device "
                "should take the same branch or iteration count.",
            ),
            "def body(i, acc):                       # acc: Unreduced['tp']\n"
            '    return st.psum(acc + part(i), "tp")  # Invariant after the body\n'
            "acc = st.fori_loop(0, n, body, acc0)",
            "def body(i, acc):\n"
            "    return acc + part(i)                 # stays Unreduced['tp']\n"
            'acc = st.psum(st.fori_loop(0, n, body, acc0), "tp")',
            "A loop body that reduces its Unreduced carry (or returns partial sums for a reduced "
            "one); cond/switch branches where one returns partial sums and another a reduced "
            "value; an Unreduced carry of a while_loop whose condition varies across devices.",
            ("SPMD301", "SPMD201"),
        ),
        _info(
            "SPMD401", "out-spec-state", BoundaryError,
            "a shard_map output's state does not fit its out_specs entry",
            "Every axis an output is Varying, Unreduced or Reduced on must be mentioned by its "
            "out_spec: Varying (or Invariant) as a partitioned dimension, Unreduced as "
            "`P(unreduced=...)`, Reduced as `P(reduced=...)`. An axis the spec leaves out must be "
            "Invariant, otherwise one device's shard would silently stand for the whole value.",
            (
                "Reduce the output over the axis (`st.psum`) if it should be replicated.",
                "Or mention the axis in out_specs: `P(\"dp\")`, `P(unreduced={\"tp\"})`.",
            ),
            'st.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P())   # f returns Varying["dp"]',
            'st.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))',
            "Forgetting the final psum of a loss; returning a partial sum under a replicated spec; a "
            "Reduced parameter returned under a partitioned spec.",
            ("SPMD402",),
        ),
        _info(
            "SPMD402", "spec-structure", BoundaryError,
            "in_specs/out_specs do not match the structure of the arguments or outputs",
            "in_specs must be a pytree prefix of the arguments (a tuple with one entry per "
            "positional argument, or a single spec for all), out_specs a prefix of the outputs.",
            ("Give one PartitionSpec per argument/output, or one spec for everything.",),
            "st.shard_map(f, mesh=mesh, in_specs=(P('dp'),), out_specs=P())   # f takes 2 arguments",
            "st.shard_map(f, mesh=mesh, in_specs=(P('dp'), P()), out_specs=P())",
            "Adding an argument without adding its spec; returning a tuple under a single spec "
            "meant for one array.",
            ("SPMD401",),
        ),
        _info(
            "SPMD403", "in-spec", BoundaryError,
            "an in_specs entry cannot be honoured",
            "`P(reduced=...)`/`P(unreduced=...)` inputs need an Explicit mesh whose argument "
            "already carries that spec, full-manual shard_map, and a JAX version that supports "
            "them; a partitioned dimension must divide evenly.",
            ("Produce the argument with a shard_map whose out_specs carry the same spec, or use a "
             "partitioned spec and cast inside.",),
            "st.shard_map(f, mesh=auto_mesh, in_specs=P(reduced={'dp'}), out_specs=P())",
            "st.shard_map(f, mesh=jax.make_mesh((2, 4), ('dp', 'tp')), in_specs=P(reduced={'dp'}), out_specs=P())",
            "Reduced/Unreduced specs on an Auto mesh, in partial-manual mode, or on jax versions "
            "without them.",
            ("SPMD402",),
        ),
        _info(
            "SPMD404", "cotangent-state", BoundaryError,
            "a cotangent given to a vjp pullback does not have the state of the output's cotangent",
            "A cotangent has its primal's state with Unreduced and Reduced swapped (Varying and "
            "Invariant are kept): a Reduced output needs an Unreduced cotangent, an Unreduced output "
            "a Reduced one. JAX raises `unexpected JAX type (e.g. shape/dtype) for argument to VJP "
            "function` for any other state.",
            (
                "Give each cotangent the state `st.cotangent_type(y)` for its output `y`.",
                "For an Unreduced output, reduce it inside the function (`st.psum`) and pass an "
                "Invariant cotangent.",
            ),
            "y, pull = st.vjp(f, w)     # y: Unreduced['tp']\n"
            "(g,) = pull(jnp.ones_like(y.raw))",
            "y, pull = st.vjp(lambda w: st.psum(f(w), 'tp'), w)\n"
            "(g,) = pull(jnp.ones_like(y.raw))",
            "Calling a pullback with the primal output's state (Reduced for Reduced), or with an "
            "Invariant cotangent for an Unreduced or Reduced output.",
            ("SPMD405",),
        ),
        _info(
            "SPMD405", "grad-loss-state", BoundaryError,
            "grad/value_and_grad was given a loss that is Unreduced or Reduced",
            "`grad` seeds the loss's cotangent with ones of the loss's cotangent state. An "
            "Invariant or Varying loss has an Invariant or Varying cotangent; an Unreduced loss "
            "needs a Reduced cotangent and a Reduced loss an Unreduced one, which a seed of ones "
            "would get wrong (JAX: `unexpected JAX type ... but expected float32[]{U:i}`).",
            (
                "Reduce an Unreduced loss inside the function: `st.psum(loss, axis)`.",
                "For a Reduced loss, cast it per device (`st.pcast(loss, axis, to=\"varying\")`) "
                "or use `st.vjp` with an explicit Unreduced cotangent.",
            ),
            "g = st.grad(partial_loss)(w)         # partial_loss returns Unreduced['tp']",
            'g = st.grad(lambda w: st.psum(partial_loss(w), "tp"))(w)',
            "Differentiating a loss built from partial sums (a row-parallel matmul) or from "
            "Reduced (ZeRO) parameters alone.",
            ("SPMD404", "SPMD201"),
        ),
        _info(
            "SPMD406", "loop-reduced-transpose", BoundaryError,
            "JAX cannot differentiate a loop whose carry or closed-over values are Reduced",
            "The cotangent of a Reduced value is Unreduced. JAX's transpose of scan/fori_loop/"
            "while_loop does not swap the state for loop carries and loop constants, and fails "
            "with `Scan carry input and output got mismatched varying manual axes` or `Expected "
            "cotangent type float32[...] but got float32[...]{U:...}` (jax 0.10.2 and 0.12.0.1). "
            "Casting the Reduced value to Varying before the loop is free and keeps its gradient "
            "Unreduced (the cast Reduced -> Varying transposes to Varying -> Unreduced).",
            (
                "Cast Reduced values to Varying before the loop: `w = st.pcast(w, axis, "
                "to=\"varying\")`; the gradient with respect to the Reduced `w` stays Unreduced.",
                "Or gather ZeRO parameters with `st.all_gather(..., to=\"varying\")` inside the "
                "loop body.",
            ),
            "def loss(w):                          # w: Reduced['dp']\n"
            "    return st.fori_loop(0, n, lambda i, h: st.numpy.tanh(h @ w), x).sum()\n"
            "g = st.grad(loss)(w)",
            "def loss(w):\n"
            "    wv = st.pcast(w, 'dp', to='varying')  # free; the gradient of w stays Unreduced\n"
            "    return st.fori_loop(0, n, lambda i, h: st.numpy.tanh(h @ wv), x).sum()\n"
            "g = st.grad(loss)(w)                  # Unreduced['dp']",
            "Differentiating a scan over layers whose weights are ZeRO parameters gathered with "
            "`all_gather(to=\"reduced\")` or declared `P(reduced=...)`, or a loop with a Reduced "
            "carry.",
            ("SPMD404", "SPMD405"),
        ),
        _info(
            "SPMD501", "unknown-axis", UsageError,
            "an axis name is not an axis of the mesh",
            "Every axis named in a collective, cast or hint must be a manual axis of the enclosing "
            "shard_map's mesh. JAX reports a bare `AssertionError` or `NameError` for this.",
            ("Use one of the mesh's axis names (the message suggests the closest).",),
            'y = st.psum(x, "tpp")',
            'y = st.psum(x, "tp")',
            "A typo, or an axis of another mesh.",
            ("SPMD503",),
        ),
        _info(
            "SPMD502", "bad-axes", UsageError,
            "axis names were given in a form JAX does not accept",
            "Axis names are a `str` or a tuple of `str` with no repeats. A set has no order (the "
            "order decides how a multi-axis collective flattens devices) and JAX rejects it.",
            ("Pass a tuple: `(\"dp\", \"tp\")`.",),
            'y = st.psum(x, {"dp", "tp"})',
            'y = st.psum(x, ("dp", "tp"))',
            "Sets or lists of axis names, repeated names.",
            ("SPMD501",),
        ),
        _info(
            "SPMD503", "non-manual-axis", UsageError,
            "an axis is in the mesh but not manual in this shard_map",
            "In a partial-manual shard_map (`axis_names=...`) only the listed axes are manual; the "
            "others are handled by the compiler and have no per-device state.",
            ("Add the axis to `axis_names`, or leave the collective over it to the compiler.",),
            'st.shard_map(f, mesh=mesh, axis_names={"dp"}, ...)   # f calls st.psum(x, "tp")',
            'st.shard_map(f, mesh=mesh, axis_names={"dp", "tp"}, ...)',
            "Partial-manual shard_map bodies that name an auto axis.",
            ("SPMD501",),
        ),
        _info(
            "SPMD504", "bad-hint", UsageError,
            "a state hint is malformed",
            "A hint names at least one axis per state, each axis once: `Varying[\"dp\"]`, "
            "`Typed[Varying[\"dp\"], Reduced[\"tp\"]]`. One axis cannot be in two states, and a "
            "value cannot be Varying and Unreduced (or Reduced) on the same axis.",
            ("Give each axis exactly one state.",),
            'def f(x: st.Typed[st.Varying["dp"], st.Reduced["dp"]]): ...',
            'def f(x: st.Typed[st.Varying["tp"], st.Reduced["dp"]]): ...',
            "Empty subscriptions, repeated axes, non-string axis names, an axis in two states.",
            (),
        ),
        _info(
            "SPMD505", "unknown-target", UsageError,
            "an unknown `to=` target was given to a cast or all_gather",
            "`pcast` takes `to=\"varying\"|\"reduced\"|\"unreduced\"`; `all_gather` takes "
            "`to=\"varying\"|\"invarying\"|\"reduced\"`.",
            ("Use one of the listed targets.",),
            'st.pcast(x, "dp", to="invariant")',
            'st.psum(x, "dp")   # Varying -> Invariant needs a collective',
            "Typos, or asking a cast for a change only a collective can make.",
            ("SPMD301",),
        ),
        _info(
            "SPMD506", "outside-shard-map", UsageError,
            "a typed collective was called outside shard_map",
            "Collectives and casts act on manual mesh axes, which exist only inside the function "
            "given to `st.shard_map` (or `jax.shard_map`).",
            ("Call it inside the shard_map'd function.",),
            'y = st.psum(x, "dp")      # at top level',
            'y = st.shard_map(lambda x: st.psum(x, "dp"), mesh=mesh, in_specs=P("dp"), out_specs=P())(x)',
            "Calling a per-shard helper directly, e.g. from a test, without a shard_map around it.",
            ("SPMD501",),
        ),
        _info(
            "SPMD507", "custom-op-declaration", UsageError,
            "an st.custom_op declaration is malformed",
            "`requires=` is `{axis: state}` (every array argument) or `{parameter: {axis: state}}`; "
            "`produces=` is `{axis: state}` or a function of the input types. States are "
            "\"invariant\", \"varying\", \"unreduced\" or \"reduced\" (or `st.State` members), and "
            "every axis must be a manual axis of the enclosing shard_map.",
            ("Fix the state name, axis or parameter name the message points at.",),
            '@st.custom_op(requires={"tp": "vary"})',
            '@st.custom_op(requires={"tp": "varying"})',
            "Typos in state names, parameters that the function does not have, axes of another "
            "mesh.",
            ("SPMD107", "SPMD501"),
        ),
        _info(
            "SPMD901", "internal-mismatch", InternalConsistencyError,
            "JAX computed a different state than spmdtyped's rule table predicted",
            "Check mode (on by default) compares every collective's result with JAX's own type. A "
            "difference means the rule table is wrong for this JAX version: please report it with "
            "the message.",
            ("Report the message; meanwhile `st.set_check_mode(False)` skips the comparison.",),
            "y = st.psum(x, 'dp')",
            "y = st.psum(x, 'dp')   # with st.set_check_mode(False) until fixed",
            "A JAX version whose rules changed.",
            (),
        ),
        _info(
            "SPMD902", "custom-op-mismatch", InternalConsistencyError,
            "a custom op's result is in a state its declaration cannot be reached from",
            "`st.custom_op` trusts its declaration and brings each result to the declared state "
            "with free casts (Invariant -> Varying/Reduced/Unreduced, Reduced -> Varying, Varying "
            "-> Unreduced), which cost nothing. A result JAX types as more varying than declared "
            "(Varying where the declaration says Invariant) cannot be cast: JAX has no free cast "
            "into Invariant, so the declaration would disagree with every later JAX check.",
            (
                "Build the kernel's outputs in the declared state (for pallas_call, ffi_call and "
                "pure_callback: result shapes with the declared `vma`).",
                "Declare the state JAX computes and reduce with a typed collective afterwards.",
                "For an undeclared `st.opaque` function that varies by itself (e.g. it calls "
                "axis_index), declare `produces={axis: \"varying\"}`.",
            ),
            "noisy = st.opaque(lambda x: x + jax.lax.axis_index('dp'))(x)   # x: Invariant",
            "noisy = st.custom_op(produces={'dp': 'varying'})(lambda x: x + jax.lax.axis_index('dp'))(x)",
            "Opaque functions that use collectives or axis_index internally; kernels whose result "
            "types are built without the declared manual-axis state.",
            ("SPMD901", "SPMD107"),
        ),
    ]
}


def info(code: str) -> ErrorInfo:
    try:
        return REGISTRY[code]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown spmdtyped error code {code!r}; known codes: {known}") from None


def error(
    code: str,
    headline: str,
    *,
    axes: Iterable[str] = (),
    states: Mapping[str, str] | None = None,
    fix: str | None = None,
    op: str | None = None,
    details: Iterable[str] = (),
) -> SpmdTypeError:
    """Build (not raise) the exception of `code`'s category."""
    cls = REGISTRY[code].category
    return cls(headline, code=code, axes=axes, states=states, fix=fix, op=op, details=details)


def render(err: SpmdTypeError) -> str:
    """The message: headline / axis states / rule / fix / opt-out / docs anchor."""
    entry = REGISTRY.get(err.code)
    lines = [f"{err.headline}  [{err.code}]"]
    lines.extend(f"  {d}" for d in err.details)
    for axis in err.axes:
        if axis in err.states:
            lines.append(f"  axis {axis!r}: the value is {err.states[axis]}")
    if entry is not None:
        lines.append(f"  rule: {entry.meaning.split('. ')[0].rstrip('.')}.")
    if err.fix:
        lines.append(f"  fix: {err.fix}")
    if entry is not None:
        if entry.strict:
            lines.append(f"  opt-out: with st.allow({entry.code!r}): ...")
        lines.append(f"  docs: {DOCS_URL}{entry.code}/  (python -m spmdtyped explain {entry.code})")
    return "\n".join(lines)


def explain(code: str) -> str:
    """The full catalogue page of an error code, as Markdown.

    **Arguments:**

    - `code`: an `"SPMD###"` code, e.g. `"SPMD101"` (case-insensitive).

    **Returns:** the page: message, what it means, solutions, an example fix, when it
    happens, and related errors.

    **Raises:** `KeyError` for an unknown code.

    !!! Example
        ```python
        print(st.explain("SPMD101"))
        ```
    """
    e = info(code.upper())
    out = [f"# {e.code}: {e.title}", "", f"mypy error code: `{e.mypy_code}`  ",
           f"category: `spmdtyped.{e.category.__name__}`", "", "## What it means", "", e.meaning, "",
           "## Solutions", ""]
    out.extend(f"{i}. {s}" for i, s in enumerate(e.solutions, 1))
    out += ["", "## Example fix", "", "Before:", "", "```python", e.before, "```", "", "After:", "",
            "```python", e.after, "```", "", "## When it happens", "", e.when, ""]
    if e.strict:
        out += ["## Opt-out", "", "JAX accepts this program (and computes a wrong or surprising "
                "result). To get JAX's behaviour for a block of code:", "", "```python",
                f"with st.allow({e.code!r}):", "    ...", "```", ""]
    if e.related:
        out += ["## Related errors", ""]
        out.extend(f"- {r}: {REGISTRY[r].title}" for r in e.related)
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- opt-outs

_ALLOWED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "spmdtyped_allowed", default=frozenset()
)


@contextlib.contextmanager
def allow(*codes: str) -> Iterator[None]:
    """Opt out of spmdtyped's strict rules (those where JAX accepts and is wrong) in a block.

    **Arguments:**

    - `*codes`: strict codes, e.g. `"SPMD103"` (collective on an Invariant axis) or
      `"SPMD202"` (non-linear op on an Unreduced value).

    Inside the block spmdtyped follows JAX's own behaviour for those codes.

    **Raises:** `UsageError` if a code is unknown or not a strict rule.

    !!! Example
        ```python
        with st.allow("SPMD103"):
            y = st.psum(x, "dp")   # n * x, as JAX computes it
        ```
    """
    for c in codes:
        if c not in REGISTRY or not REGISTRY[c].strict:
            strict = sorted(k for k, v in REGISTRY.items() if v.strict)
            raise UsageError(
                f"st.allow: {c!r} is not a strict rule that can be opted out of; strict codes: "
                f"{', '.join(strict)}",
                code="SPMD504",
            )
    token = _ALLOWED.set(_ALLOWED.get() | frozenset(codes))
    try:
        yield
    finally:
        _ALLOWED.reset(token)


def allowed(code: str) -> bool:
    return code in _ALLOWED.get()

"""The error catalogue, part 1: the page of every SPMD1xx-3xx code (what a value in a given
state can go through: collectives, elementwise ops, casts).

Pure data, no imports from spmdtyped and no JAX: `_errors` builds `REGISTRY` from `PAGES` here
and in `_error_pages_boundary` (SPMD4xx/5xx/9xx). The exception class of a code follows from
its hundreds digit (see `_errors.CATEGORIES`). A page is what `st.explain(code)` prints and
`docs/hooks.py` publishes: headline, the rule in one sentence, the fix as code, the wrong code
and the fixed code, then the longer prose.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class ErrorPage:
    """One page of the error catalogue, built by keyword only.

    `title` is a short name (the mypy error code's description, the docs' navigation); `headline`
    says what went wrong in one line; `rule` is the one sentence a message prints as `rule:`;
    `fix` is the generic fix as code (a message prints its own concrete fix when it has one);
    `before` raises the code and `after` is the same program fixed; `solutions` are the ways
    out, `when` the situations that lead here; `opt_out` marks a strict code (JAX accepts the
    program and computes a wrong or surprising result) that `st.allow(code)` can switch off.
    """

    code: str
    slug: str  # the mypy plugin reports it as ``spmd-<slug>``
    title: str
    headline: str
    rule: str
    meaning: str
    fix: str
    solutions: tuple[str, ...]
    before: str
    after: str
    when: str
    related: tuple[str, ...] = ()
    opt_out: bool = False

    @property
    def mypy_code(self) -> str:
        return f"spmd-{self.slug}"

    @property
    def strict(self) -> bool:
        """The older name of `opt_out` (docs and tests call these codes "strict")."""
        return self.opt_out


PAGES: tuple[ErrorPage, ...] = (
    ErrorPage(
        code="SPMD101", slug="reduced-operand", title="Reduced operand of a collective",
        headline="an axis collective was given a value that is Reduced on that axis",
        rule="A collective over an axis never takes a value that is Reduced on that axis.",
        meaning="A Reduced value is already the result of a reduction over the axis: it is replicated, and "
                "its gradient is Unreduced. Summing, gathering or permuting it over the same axis would "
                "communicate a value that is not per-device. JAX reports this as `psum cannot accept args "
                "which are reduced` (or `pvary cannot accept args which are reduced`).",
        fix="y = x   # x is already reduced (replicated) over the axis: drop the collective",
        solutions=(
            "Drop the collective: the value is already complete on every device (a gathered parameter "
            "needs no second sum), or use the value from before the reduction (the Varying value you "
            "all-gathered or summed).",
            'Cast it back to a per-device value first, `st.psum(st.pcast(x, axis, to="varying"), axis)`, '
            "only if you want every device's copy counted: this changes the numbers (a psum gives n·x, "
            "n devices on the axis).",
            "If a custom primitive produced the Reduced value, declare its effects with `st.custom_op` so "
            "the right state is recorded.",
        ),
        before='w = st.all_gather(w_shard, "dp", to="reduced")\n'
               'y = st.psum(w, "dp")',
        after='w = st.all_gather(w_shard, "dp", to="reduced")\n'
              'y = w                                 # the gather already assembled the full w',
        when="psum/pmean/pmax/pmin/ppermute/pshuffle/all_gather/psum_scatter/all_to_all over an axis where "
             "the input is Reduced: typically a ZeRO/FSDP parameter gathered with "
             '`all_gather(to="reduced")` or declared `P(reduced=...)`, then reduced again.',
        related=("SPMD102", "SPMD103", "SPMD301"),
    ),
    ErrorPage(
        code="SPMD102", slug="unreduced-operand", title="Unreduced operand of a non-reducing collective",
        headline="an axis collective that does not reduce was given a value that is Unreduced on that axis",
        rule="Only a reduction (psum, pmean, psum_scatter) takes a value that is Unreduced on its axis.",
        meaning="An Unreduced value holds partial results whose true value is their sum over the axis. Only"
                " a reduction (`psum`, `pmean`, `psum_scatter`; `pmax`/`pmin` for the max/min kind) can "
                "consume it; permuting or gathering partial sums is almost always a mistake.",
        fix="st.psum(x, axis)",
        solutions=(
            "Reduce it first: `st.psum(x, axis)` or, to keep it sharded, `st.psum_scatter(x, axis, "
            "tiled=True)`.",
        ),
        before='g = st.all_gather(partial, "tp")',
        after='g = st.all_gather(st.psum_scatter(partial, "tp", tiled=True), "tp", tiled=True)',
        when="ppermute/all_gather/all_to_all (or pmax/pmin of a sum-kind value) over an axis where the "
             "input is Unreduced, e.g. the output of a row-parallel matmul declared unreduced.",
        related=("SPMD101", "SPMD106"),
    ),
    ErrorPage(
        code="SPMD103", slug="invariant-operand", title="Invariant operand of a collective",
        headline="an axis collective was given a value that is already Invariant on that axis",
        rule="A collective over an axis never takes a value that is already Invariant on that axis.",
        meaning="An Invariant value is identical on every device of the axis. JAX silently `pvary`s it "
                "first, so `psum` returns n·x (a double sum), `pmean` of already-summed gradients is a "
                "no-op that hides a bug, and a ppermute/all_gather moves identical data. spmdtyped rejects "
                "it: say explicitly that you want a per-device copy. The result of an `all_gather` over "
                "the axis (and what is computed from it alone) is the same on every device too, though "
                "JAX types it Varying: a `psum`/`psum_scatter` or a second `all_gather` over that axis "
                "double-counts it, and the refinement reports it (a cast, `pcast(x, to='varying')`, is "
                "the opt-out and is not checked).",
        fix="y = x   # x is already Invariant over the axis: drop the collective",
        solutions=(
            "Drop the collective if the value is already reduced (the common double-psum bug).",
            "If you really want n·x, say so: `st.psum(st.pvary(x, axis), axis)` (or `x * "
            "st.axis_size(axis)`).",
            'One-line opt-out for a block of code: `with st.allow("SPMD103"): ...`.',
        ),
        before="g = st.grad(loss)(w)                         # w: Invariant, so g is Invariant over dp\n"
               'g = st.psum(g, "dp")                         # a second sum: n * g',
        after="g = st.grad(loss)(w)                         # already summed over dp by grad",
        when="A second psum/pmean of a value that was already reduced; gradients of Invariant parameters "
             "(jax.grad already sums them over the axis); a collective over an axis the input is not "
             "sharded on; a psum of a value gathered over the same axis (a token count of a gathered "
             "mask).",
        related=("SPMD104",),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD104", slug="mixed-states", title="Mixed states across a collective's axes",
        headline="a collective over several axes was given a value whose state differs between those axes",
        rule="A collective over several axes needs the value in the same state on all of them.",
        meaning="A call over a tuple of axes needs the value in one state on all of them: JAX raises `psum "
                "can only accept axis_name which corresponds to one of varying, unreduced, reduced or "
                "invarying state of the input` for psum/psum_scatter/pcast, and for ppermute or all_gather "
                "it silently pvarys the Invariant axes.",
        fix='st.psum(x, "dp")   # only the axes x is Varying on',
        solutions=(
            'Split the call per axis state, or cast the lagging axes first: `st.pvary(x, "tp")` turns '
            "Invariant into Varying.",
        ),
        before='y = st.psum(x, ("dp", "tp"))     # x: Varying["dp"]',
        after='y = st.psum(x, "dp")             # x is Invariant over tp already',
        when="Tuple axis names where the value is Varying on some axes and Invariant or Unreduced on others.",
        related=("SPMD103", "SPMD101"),
    ),
    ErrorPage(
        code="SPMD105", slug="pmean-denominator", title="pmean of a value pending on another axis",
        headline="pmean of a value that is Unreduced or Reduced on another axis",
        rule="A pmean over an axis needs a value that is neither Unreduced nor Reduced on any other axis.",
        meaning="`pmean` divides by the axis size, a replicated constant; JAX cannot divide a value that is"
                " Unreduced or Reduced on some other axis by it (`Inputs cannot be replicated...` or "
                "`unreduced rule for div`).",
        fix="st.pmean(st.psum(x, other_axis), axis)",
        solutions=(
            "Reduce the other axis first, or use `st.psum(x, axis) / st.axis_size(axis)` on a value whose "
            "other axes are Varying or Invariant.",
        ),
        before='m = st.pmean(x, "dp")             # x: Typed[Varying["dp"], Unreduced["tp"]]',
        after='m = st.pmean(st.psum(x, "tp"), "dp")',
        when="Averaging over one axis a value that still has pending partial sums or a reduced marker on "
             "another axis.",
        related=("SPMD201", "SPMD203"),
    ),
    ErrorPage(
        code="SPMD106", slug="unreduced-kind", title="Reduction of the wrong kind",
        headline="a reduction of the wrong kind was applied to an Unreduced value",
        rule="An Unreduced value is completed only by the reduction of its pending kind: psum for sums, "
             "pmax/pmin for max/min.",
        meaning="Since jax 0.12 an Unreduced value records which reduction is pending (sum, max or min). "
                "`psum` completes a sum, `pmax`/`pmin` a max/min; any other combination would compute the "
                "wrong value.",
        fix="st.psum(x, axis)   # for a sum-kind Unreduced value",
        solutions=("Use the reduction that matches the pending kind.",),
        before='y = st.pmax(partial_sums, "tp")',
        after='y = st.psum(partial_sums, "tp")',
        when="pmax/pmin on a sum-kind Unreduced value (always the case on jax 0.10), psum on a max/min-kind"
             " value.",
        related=("SPMD102",),
    ),
    ErrorPage(
        code="SPMD107", slug="custom-op-requires", title="Custom op argument in the wrong state",
        headline="a custom op was given a value whose state differs from its declared `requires`",
        rule="Every argument of a custom op has, on each axis, the state its `requires=` declares.",
        meaning="`st.custom_op(requires=...)` declares the state each input must have on each axis, as a "
                "collective does: a custom all-reduce needs Varying input, a kernel consuming partial sums "
                "needs Unreduced input. Calling it on a value in another state would run the kernel on data"
                " it does not expect (JAX cannot check opaque kernels, callbacks or FFI calls at all).",
        fix="my_op(st.pvary(x, axis))",
        solutions=(
            "Cast the argument: `st.pvary(x, axis)` (Invariant -> Varying), `st.pcast(x, axis, "
            'to="varying")` (Reduced -> Varying).',
            "Reduce it first if it is Unreduced: `st.psum(x, axis)`.",
            "If the declaration is too strict, fix `requires=` (one `{axis: state}` for every argument, or "
            "`{parameter: {axis: state}}`).",
        ),
        before='@st.custom_op(requires={"tp": "varying"}, produces={"tp": "invariant"})\n'
               'def ring_allreduce(x):\n'
               '    return jax.lax.psum(x, "tp")\n'
               'y = ring_allreduce(w)                        # w: Invariant',
        after='@st.custom_op(requires={"tp": "varying"}, produces={"tp": "invariant"})\n'
              'def ring_allreduce(x):\n'
              '    return jax.lax.psum(x, "tp")\n'
              'y = ring_allreduce(st.pvary(w, "tp"))        # Varying, as declared',
        when="Custom collectives, Pallas/FFI kernels and callbacks wrapped with `st.custom_op`, called on a"
             " value that is Invariant, Reduced or Unreduced where the declaration wants another state.",
        related=("SPMD103", "SPMD507", "SPMD902"),
    ),
    ErrorPage(
        code="SPMD201", slug="unreduced-mismatch", title="Unreduced combined with a non-Unreduced value",
        headline="an Unreduced value was combined with a value that is not Unreduced on the same axes",
        rule="An Unreduced value combines only with values Unreduced on the same axes, or with factors "
             "Reduced on exactly those axes.",
        meaning="Σ_d a_d + b is not Σ_d (a_d + b): adding a non-partial value to partial sums would count "
                "it once per device. Unreduced combines only linearly: U + U on the same axes, U × R (or U "
                "/ R) with R reduced on exactly those axes.",
        fix="st.psum(u, axis) + b",
        solutions=(
            "Reduce first: `st.psum(u, axis) + b`.",
            'Scale with a Reduced factor: `u * st.pcast(c, axis, to="reduced")` (Python scalars are cast '
            "for you).",
        ),
        before="y = u + bias",
        after='y = st.psum(u, "tp") + bias',
        when="Adding a bias to the output of a row-parallel matmul before its psum; multiplying two "
             "Unreduced values; adding a constant to an Unreduced value.",
        related=("SPMD202", "SPMD205"),
    ),
    ErrorPage(
        code="SPMD202", slug="nonlinear-unreduced", title="Non-linear op on an Unreduced value",
        headline="an operation not declared linear was applied to an Unreduced value",
        rule="Only an operation declared linear takes an Unreduced value.",
        meaning="f(Σ_d x_d) ≠ Σ_d f(x_d) unless f is linear. JAX rejects most non-linear ops on Unreduced "
                "values, but silently drops the state through `cumsum`, `**`, `where`, `flip`, `argmax`, "
                "`.at[].set` and more, returning wrong numbers typed Invariant.",
        fix="f(st.psum(u, axis))",
        solutions=(
            "Reduce first: `f(st.psum(u, axis))`.",
            "For an op that is linear but not in the table, declare it with `st.custom_op`.",
            "One-line opt-out (JAX's unsound behaviour): `with st.allow(\"SPMD202\"): ...`.",
        ),
        before="y = st.numpy.tanh(u)",
        after='y = st.numpy.tanh(st.psum(u, "tp"))',
        when="An activation, comparison, power, cumulative op or indexing update applied to partial sums "
             '(the output of a row-parallel matmul or of `pcast(to="unreduced")`).',
        related=("SPMD201",),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD203", slug="reduced-replicated", title="Reduced combined with an Invariant array",
        headline="a Reduced value was combined with a value that is Invariant on its reduced axes",
        rule="Every operand of an op with a Reduced operand is Varying, Unreduced or Reduced on the reduced"
             " axes.",
        meaning="JAX requires every operand of an op with a Reduced input to be Varying, Unreduced or "
                "Reduced on those axes (`Inputs cannot be replicated on the same axes that another input is"
                " reduced on`): the cotangent of the Invariant operand would otherwise be summed "
                "implicitly. Python scalars are cast for you; arrays are not.",
        fix='r * st.pcast(c, axis, to="reduced")',
        solutions=(
            'Make the other operand Reduced too: `st.pcast(c, axis, to="reduced")`.',
            'Or make the Reduced operand Varying: `st.pcast(r, axis, to="varying")`.',
        ),
        before="y = w * scale          # w: Reduced['dp'], scale: Invariant array",
        after='y = w * st.pcast(scale, "dp", to="reduced")',
        when="Multiplying a ZeRO parameter by an Invariant array, adding an Invariant bias to it, or "
             "combining it with a value Varying on a different axis.",
        related=("SPMD204", "SPMD205"),
    ),
    ErrorPage(
        code="SPMD204", slug="reduced-mismatch", title="Reduced on different axes",
        headline="operands are Reduced on different axes",
        rule="All Reduced operands of one op are Reduced on the same axes.",
        meaning="All Reduced operands of one op must be reduced over the same axes (JAX: `All inputs should"
                " be reduced across the same mesh axes`).",
        fix='st.pcast(a, "dp", to="varying") + st.pcast(b, "tp", to="varying")',
        solutions=(
            'Cast each operand to Varying on the axes it alone is Reduced on: `st.pcast(x, axis, to="varying")`.'
            " Casting one side only leaves it Invariant where the other is Reduced (SPMD203).",
        ),
        before="y = a + b              # a: Reduced['dp'], b: Reduced['tp']",
        after='y = st.pcast(a, "dp", to="varying") + st.pcast(b, "tp", to="varying")',
        when="Combining parameters sharded for ZeRO over different mesh axes.",
        related=("SPMD203",),
    ),
    ErrorPage(
        code="SPMD205", slug="partial-cast", title="Operand needs a partial cast",
        headline="an operand would need a cast out of Unreduced or Reduced on part of the other operand's "
                 "varying axes",
        rule="Operands agree only through free casts: Invariant to Varying, or Reduced to Varying on "
             "exactly its Reduced axes.",
        meaning="JAX makes operands agree on their varying axes by casting: Invariant → Varying (pvary) on "
                "the missing axes, or Reduced → Varying when the Reduced axes are exactly the missing ones."
                " No cast exists out of Unreduced, and JAX has no partial Reduced → Varying cast (`pvary "
                "cannot accept args which are unreduced/reduced`).",
        fix='x + st.pcast(r, axis, to="varying")',
        solutions=(
            'Cast the Reduced operand yourself on its reduced axes: `st.pcast(r, axis, to="varying")`.',
            "Reduce the Unreduced operand first: `st.psum(u, axis)`.",
        ),
        before='y = x + w              # x: Varying["dp", "tp"], w: Reduced["dp"]',
        after='y = x + st.pcast(w, "dp", to="varying")',
        when="V:(dp,tp) + R:dp; U:tp + V:tp; matmul of a value Varying on more axes than a Reduced "
             "parameter is reduced on.",
        related=("SPMD201", "SPMD203"),
    ),
    ErrorPage(
        code="SPMD301", slug="unsupported-cast", title="Unsupported cast",
        headline="pcast/pvary cannot make this state change",
        rule="The only casts are Invariant to Varying, Reduced to Varying, Invariant to Reduced and Varying"
             " to Unreduced.",
        meaning="The free casts are Invariant → Varying, Reduced → Varying, Invariant → Reduced and Varying"
                " → Unreduced. Nothing casts out of Unreduced or into Invariant: those need a collective "
                'that communicates (psum, all_gather(to="invarying")). JAX raises `Unsupported pcast '
                'from=..., to=...`; note that `pcast(to="varying")` of a Varying value is an error, not a '
                "no-op.",
        fix='st.pcast(st.pvary(x, axis), axis, to="unreduced")   # via Varying; into Invariant needs st.psum',
        solutions=(
            "Drop the cast if the value already has the target state.",
            "Use a collective for a change that communicates: `st.psum` (Varying/Unreduced → Invariant), "
            '`st.all_gather(..., to="reduced")` (Varying → Reduced).',
            'Out of Unreduced: `st.pvary(st.psum(u, axis), axis)` is the summed value on every device; '
            '`st.psum_scatter(u, axis, tiled=True)` is cheaper but keeps only this device\'s shard of '
            "the sum (a different shape: it changes the numbers each device holds).",
        ),
        before='v = st.pcast(u, "tp", to="varying")          # u: Unreduced["tp"]',
        after='v = st.pvary(st.psum(u, "tp"), "tp")         # the summed value, on every device',
        when="Casting twice, casting Invariant straight to Unreduced (go through Varying), or casting "
             "Varying to Reduced.",
        related=("SPMD101", "SPMD102"),
    ),
    ErrorPage(
        code="SPMD302", slug="carry-state", title="Loop carry or branch output changes state",
        headline="a loop carry or branch output changes state in a way no free cast can fix",
        rule="A loop carry or a branch output reaches one state through free casts, and nothing casts into "
             "or out of Unreduced.",
        meaning="A loop carry has one state on every iteration, and each output of cond/switch one state in"
                " every branch. spmdtyped joins differing states with the free casts that keep the value "
                "(Invariant -> Varying, Invariant -> Reduced, Reduced -> Varying), casting the initial "
                "carry or a branch's output and retracing. Nothing casts into or out of Unreduced without "
                "changing what the value means, so a carry that is Unreduced on one side only, or Unreduced"
                " under a loop condition or branch predicate that varies across devices, cannot be joined. "
                "JAX reports these as `scan body function carry input and carry output must have equal "
                "types` or `cond branches must have equal output types`.",
        fix="st.psum(st.fori_loop(0, n, body, acc0), axis)",
        solutions=(
            "Keep the carry Unreduced through the loop and reduce after it: `st.psum(st.fori_loop(...), "
            "axis)`.",
            "Start an Unreduced accumulator Unreduced: `st.pcast(st.pvary(jnp.zeros(shape), axis), axis, "
            'to="unreduced")` (zero is a valid partial sum).',
            "Make a varying predicate Invariant first (`st.pmax(pred, axis)`) if every device should take "
            "the same branch or iteration count.",
        ),
        before="def body(i, acc):                       # acc: Unreduced['tp']\n"
               '    return st.psum(acc + part(i), "tp")  # Invariant after the body\n'
               "acc = st.fori_loop(0, n, body, acc0)",
        after="def body(i, acc):\n"
              "    return acc + part(i)                 # stays Unreduced['tp']\n"
              'acc = st.psum(st.fori_loop(0, n, body, acc0), "tp")',
        when="A loop body that reduces its Unreduced carry (or returns partial sums for a reduced one); "
             "cond/switch branches where one returns partial sums and another a reduced value; an Unreduced"
             " carry of a while_loop whose condition varies across devices.",
        related=("SPMD301", "SPMD201"),
    ),
    ErrorPage(
        code="SPMD303", slug="varying-predicate", title="Branch on a varying predicate with Invariant results",
        headline="a raw cond/switch/while_loop branches on a predicate that varies over an axis, and JAX "
                 "types a result Invariant there",
        rule="A branch or loop whose predicate varies over an axis takes operands that vary over it (or a "
             "uniform predicate).",
        meaning="With a predicate that differs across devices (`axis_index(a) == 0`, a per-shard count), "
                "devices take different branches, so the result differs per device although JAX types it "
                "Invariant when the operands are. Under grad the cotangents of the Invariant operands are "
                "reduced (psum) inside the branches, where only some devices run them: the gradient is "
                "wrong with no error (jax#40823: 16 instead of 23 on 8 devices). Casting the operands to "
                "Varying before the branch moves that reduction outside, where every device takes part. "
                "`st.cond`, `st.switch` and `st.while_loop` do this cast themselves; `infer` reports the raw"
                " form, and `st.cond`/`st.switch` report a branch that *closes over* a value being "
                "differentiated and replicated over the predicate's axes (not an operand, it cannot "
                "be cast: pass it as an operand).",
        fix='x = jax.lax.pcast(x, "tp", to="varying")   # before the branch; or st.cond(...)',
        solutions=(
            'Cast each operand to Varying over the predicate\'s axes before the branch: `jax.lax.pcast(x, '
            'axis, to="varying")`, or use `st.cond` / `st.switch` / `st.while_loop`, which do it.',
            "If every device should take the same branch, make the predicate uniform: `jax.lax.pmax(pred,"
            " axis)`.",
        ),
        before="def f(x):                                # x: Invariant\n"
               '    y = jax.lax.cond(jax.lax.axis_index("dp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)\n'
               "    return y[None]\n"
               'rep = st.adapters.infer(f, b, mesh=mesh, in_specs=P(), out_specs=P("dp"))\n'
               "if not rep.ok:\n"
               "    raise rep.violations[0]",
        after="def f(x):\n"
              '    x = jax.lax.pcast(x, "dp", to="varying")\n'
              '    y = jax.lax.cond(jax.lax.axis_index("dp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)\n'
              "    return y[None]\n"
              'rep = st.adapters.infer(f, b, mesh=mesh, in_specs=P(), out_specs=P("dp"))\n'
              "if not rep.ok:\n"
              "    raise rep.violations[0]",
        when="Rank-dependent code paths (`axis_index(a) == 0` for the first stage of a pipeline, the owner "
             "of a slice), per-device early exits, data-dependent predicates on sharded data, "
             "differentiated.",
        related=("SPMD302", "SPMD407"),
    ),
)

"""The error catalogue, part 2: the page of every SPMD4xx (shard_map boundary and autodiff),
SPMD5xx (bad input to spmdtyped) and SPMD9xx (spmdtyped's self-checks) code.

Pure data, no JAX; see `_error_pages` for the page format.
"""

from __future__ import annotations

from .pages import ErrorPage

PAGES: tuple[ErrorPage, ...] = (
    ErrorPage(
        code="SPMD401", slug="out-spec-state", title="Output state does not fit out_specs",
        headline="a shard_map output's state does not fit its out_specs entry",
        rule="Every axis an output is not Invariant on is named by its out_spec: partitioned, `unreduced=` "
             "or `reduced=`.",
        meaning="Every axis an output is Varying, Unreduced or Reduced on must be mentioned by its "
                "out_spec: Varying (or Invariant) as a partitioned dimension, Unreduced as "
                "`P(unreduced=...)`, Reduced as `P(reduced=...)`. An axis the spec leaves out must be "
                "Invariant, otherwise one device's shard would silently stand for the whole value. "
                "The same code reports a returned value that does not fit the function's return "
                "hint (`-> Invariant` returning an Unreduced or Varying value; a partial sum "
                "returned for `-> st.Rep[...]`): at the `return` under mypy with the plugin, at "
                "the boundary at runtime.",
        fix='out_specs=P("dp")   # or st.psum(y, "dp") to make y Invariant',
        solutions=(
            "Reduce the output over the axis (`st.psum`) if it should be replicated.",
            'Or mention the axis in out_specs: `P("dp")`, `P(unreduced={"tp"})`.',
            "For a return hint: reduce the value before returning it, or make the hint say what "
            "the function returns.",
        ),
        before='st.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P())(x)     # f returns Varying["dp"]',
        after='st.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(x)',
        when="Forgetting the final psum of a loss; returning a partial sum under a replicated spec; a "
             "Reduced parameter returned under a partitioned spec; `P(unreduced=...)` or "
             "`P(reduced=...)` out_specs in a partial-manual shard_map (`axis_names=`), which JAX "
             "cannot lower.",
        related=("SPMD402",),
    ),
    ErrorPage(
        code="SPMD402", slug="spec-structure", title="Specs do not match the values' structure",
        headline="in_specs/out_specs do not match the structure of the arguments or outputs",
        rule="The in_specs are a pytree prefix of the arguments, and the out_specs a pytree prefix of the outputs.",
        meaning="in_specs must be a pytree prefix of the arguments (a tuple with one entry per positional "
                "argument, or a single spec for all), out_specs a prefix of the outputs.",
        fix='in_specs=(P("dp"), P())   # one spec per argument',
        solutions=("Give one PartitionSpec per argument/output, or one spec for everything.",),
        before='st.shard_map(f, mesh=mesh, in_specs=(P("dp"),), out_specs=P())(x, b)   # f takes 2 arguments',
        after='st.shard_map(f, mesh=mesh, in_specs=(P("dp"), P()), out_specs=P())(x, b)',
        when="Adding an argument without adding its spec; returning a tuple under a single spec meant for "
             "one array.",
        related=("SPMD401",),
    ),
    ErrorPage(
        code="SPMD403", slug="in-spec", title="in_specs entry cannot be honoured",
        headline="an in_specs entry cannot be honoured",
        rule="An in_spec fits its argument: partitioned over manual axes that divide the dimension, and Reduced or "
             "Unreduced only on an Explicit full-manual mesh whose argument already carries the spec.",
        meaning="`P(reduced=...)`/`P(unreduced=...)` inputs need an Explicit mesh whose argument already "
                "carries that spec, full-manual shard_map, and a JAX version that supports them; a "
                "partitioned dimension must divide evenly.",
        fix="st.shard_map(f, mesh=mesh, in_specs=P(reduced={\"dp\"}), out_specs=P(reduced={\"dp\"}))   # full-manual",
        solutions=(
            "Make every mesh axis manual (drop `axis_names`) for Reduced/Unreduced specs, on an Explicit mesh "
            "(`jax.make_mesh`'s default).",
            "Produce the argument with a shard_map whose out_specs carry the same spec, or use a partitioned "
            "spec and cast inside.",
            "Shard the argument as its spec says (`jax.device_put(x, NamedSharding(mesh, spec))`).",
        ),
        before='st.shard_map(f, mesh=mesh, in_specs=P(reduced={"dp"}), out_specs=P(reduced={"dp"}),\n'
               '             axis_names={"dp"})                 # partial-manual',
        after='st.shard_map(f, mesh=mesh, in_specs=P(reduced={"dp"}), out_specs=P(reduced={"dp"}))',
        when="Reduced/Unreduced specs on an Auto mesh, in partial-manual mode, or on jax versions without "
             "them.",
        related=("SPMD402",),
    ),
    ErrorPage(
        code="SPMD404", slug="cotangent-state", title="Cotangent in the wrong state",
        headline="a cotangent given to a vjp pullback does not have the state of the output's cotangent",
        rule="The cotangent of an output has the output's state with Unreduced and Reduced swapped.",
        meaning="A cotangent has its primal's state with Unreduced and Reduced swapped (Varying and "
                "Invariant are kept): a Reduced output needs an Unreduced cotangent, an Unreduced output a "
                "Reduced one. JAX raises `unexpected JAX type (e.g. shape/dtype) for argument to VJP "
                "function` for any other state.",
        fix="pull(ct)   # ct in the state st.cotangent_type(y)",
        solutions=(
            "Give each cotangent the state `st.cotangent_type(y)` for its output `y`.",
            "For an Unreduced output, reduce it inside the function (`st.psum`) and pass an Invariant "
            "cotangent.",
        ),
        before="y, pull = st.vjp(f, w)     # y: Unreduced['tp']\n"
               "(g,) = pull(jnp.ones_like(y.raw))",
        after="y, pull = st.vjp(lambda w: st.psum(f(w), 'tp'), w)\n"
              "(g,) = pull(jnp.ones_like(y.raw))",
        when="Calling a pullback with the primal output's state (Reduced for Reduced), or with an Invariant"
             " cotangent for an Unreduced or Reduced output.",
        related=("SPMD405",),
    ),
    ErrorPage(
        code="SPMD405", slug="grad-loss-state", title="Loss is Unreduced or Reduced",
        headline="grad/value_and_grad was given a loss that is Unreduced or Reduced",
        rule="The loss given to grad is Invariant or Varying on every axis.",
        meaning="`grad` seeds the loss's cotangent with ones of the loss's cotangent state. An Invariant or"
                " Varying loss has an Invariant or Varying cotangent; an Unreduced loss needs a Reduced "
                "cotangent and a Reduced loss an Unreduced one, which a seed of ones would get wrong (JAX: "
                "`unexpected JAX type ... but expected float32[]{U:i}`). jax 0.12.1 seeds a Reduced "
                "loss itself (an Unreduced seed: the gradients' sum is the derivative of the "
                "replicated loss), so there only an Unreduced loss is SPMD405.",
        fix="st.grad(lambda w: st.psum(loss(w), axis))(w)",
        solutions=(
            "Reduce an Unreduced loss inside the function: `st.psum(loss, axis)`.",
            'For a Reduced loss, cast it per device (`st.pcast(loss, axis, to="varying")`) or use `st.vjp` '
            "with an explicit Unreduced cotangent.",
        ),
        before="g = st.grad(partial_loss)(w)         # partial_loss returns Unreduced['tp']",
        after='g = st.grad(lambda w: st.psum(partial_loss(w), "tp"))(w)',
        when="Differentiating a loss built from partial sums (a row-parallel matmul) or from Reduced (ZeRO)"
             " parameters alone.",
        related=("SPMD404", "SPMD201"),
    ),
    ErrorPage(
        code="SPMD406", slug="loop-reduced-transpose", title="Differentiated loop with Reduced values",
        headline="JAX cannot differentiate a loop whose carry or closed-over values are Reduced",
        rule="A loop that is differentiated neither carries nor closes over a Reduced value.",
        meaning="The cotangent of a Reduced value is Unreduced. JAX's transpose of "
                "scan/fori_loop/while_loop does not swap the state for loop carries and loop constants, and"
                " fails with `Scan carry input and output got mismatched varying manual axes` or `Expected "
                "cotangent type float32[...] but got float32[...]{U:...}` (jax 0.10.2 and 0.12.0.1; "
                "jax 0.12.1 differentiates these loops, and the code is not raised there). "
                "Casting the Reduced value to Varying before the loop is free and keeps its gradient "
                "Unreduced (the cast Reduced -> Varying transposes to Varying -> Unreduced).",
        fix='w = st.pcast(w, axis, to="varying")   # before the loop; the gradient stays Unreduced',
        solutions=(
            'Cast Reduced values to Varying before the loop: `w = st.pcast(w, axis, to="varying")`; the '
            "gradient with respect to the Reduced `w` stays Unreduced.",
            'Or gather ZeRO parameters with `st.all_gather(..., to="varying")` inside the loop body.',
        ),
        before="def loss(w):                          # w: Reduced['dp']\n"
               "    return st.fori_loop(0, n, lambda i, h: st.numpy.tanh(h @ w), x).sum()\n"
               "g = st.grad(loss)(w)",
        after="def loss(w):\n"
              "    wv = st.pcast(w, 'dp', to='varying')  # free; the gradient of w stays Unreduced\n"
              "    return st.fori_loop(0, n, lambda i, h: st.numpy.tanh(h @ wv), x).sum()\n"
              "g = st.grad(loss)(w)                  # Unreduced['dp']",
        when="Differentiating a scan over layers whose weights are ZeRO parameters gathered with "
             '`all_gather(to="reduced")` or declared `P(reduced=...)`, or a loop with a Reduced carry.',
        related=("SPMD404", "SPMD405"),
    ),
    ErrorPage(
        code="SPMD407", slug="vmap-grad-invariant", title="Per-example gradients of replicated parameters",
        headline="grad under vmap of a per-example loss Varying over an axis, with respect to a parameter "
                 "Invariant over it",
        rule="Under vmap, grad with respect to a parameter takes a parameter that varies on every axis "
             "the per-example loss varies on.",
        meaning="Inside shard_map, the gradient of a Varying loss with respect to an Invariant parameter is "
                "summed over the devices: JAX inserts an implicit pvary of the parameter, whose transpose "
                "is a psum. For a total loss that is right. Under `jax.vmap(grad(...))` each per-example "
                "gradient is summed over the devices too, so example i of device 0 gets the sum of the "
                "i-th gradients of every device (jax#36886), with no error. Casting the parameter to "
                "Varying first gives every device its own copy, whose per-example gradients stay local. "
                "Strict: the sum of the per-example gradients over the batch (`sum(vmap(grad(...)), 0)`) "
                "is the right total gradient; `st.allow(\"SPMD407\")` accepts it.",
        fix='params = st.pcast(params, "dp", to="varying")   # before jax.vmap(st.grad(...))',
        solutions=(
            'Cast the replicated parameters to Varying before the vmap: `st.pcast(params, axis, '
            'to="varying")`; the per-example gradients are then Varying and local.',
            "For the total gradient, differentiate the summed loss instead: `st.grad(lambda p: "
            "jnp.sum(jax.vmap(net, (None, 0))(p, xs)))(params)`.",
            'Or, if only the sum over the batch is used, `with st.allow("SPMD407"):`.',
        ),
        before="net = lambda p, x: st.numpy.sin((p * x).sum())\n"
               "g = jax.vmap(st.grad(net), in_axes=(None, 0))(w, xb)   # w: Invariant, xb: Varying['dp']",
        after="net = lambda p, x: st.numpy.sin((p * x).sum())\n"
              "w = st.pcast(w, 'dp', to='varying')\n"
              "g = jax.vmap(st.grad(net), in_axes=(None, 0))(w, xb)   # per-example, Varying['dp']",
        when="Per-example gradients (DP-SGD clipping, influence functions, gradient-noise estimates) "
             "computed inside shard_map with data-parallel samples and replicated parameters.",
        related=("SPMD405", "SPMD103"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD408", slug="opaque-drops-axis", title="Opaque computation drops a varying axis",
        headline="an opaque computation (callback, FFI call, custom kernel) takes an input varying over an "
                 "axis and JAX types its result as not varying there",
        rule="What leaves an opaque computation varies over every axis one of its inputs varies over.",
        meaning="JAX cannot see inside a host callback or an FFI kernel, and types its results Invariant "
                "whatever its inputs vary on. A per-device result is then taken for a replicated one: a "
                "later psum double counts it, and under grad the kernel's cotangent for a replicated input "
                "is a per-device partial sum that JAX takes for the finished gradient (jax-finufft#226). "
                "Cast the replicated inputs to Varying before the kernel (their cotangents are then summed "
                "by the cast's transpose) and the kernel's outputs and cotangents to Varying after it. "
                "`st.opaque(kernel)` / `st.custom_op` do both; `infer` reports the raw form at the call.",
        fix='y = st.opaque(kernel)(g, x)   # or pcast g, the outputs and the cotangents to varying',
        solutions=(
            "Wrap the kernel with `st.opaque` (or `st.custom_op`): replicated inputs are cast to Varying, "
            "a `jax.custom_vjp` kernel's outputs and cotangents get their primals' states.",
            'By hand: `g = jax.lax.pcast(g, axis, to="varying")` before the call, and cast the results '
            "of the callbacks (forward and backward) to varying inside the kernel.",
        ),
        before="def f(g, x):                           # g: Invariant, x: Varying['dp']\n"
               "    y = jax.pure_callback(np.matmul, jax.ShapeDtypeStruct(x.shape[:1], x.dtype), x, g,\n"
               "                          vmap_method='sequential')   # typed Invariant\n"
               "    return (y * y).sum()\n"
               "rep = st.adapters.infer(f, g, x, mesh=mesh, in_specs=(P(), P('dp')), out_specs=P())\n"
               "if not rep.ok:\n"
               "    raise rep.violations[0]",
        after="def f(g, x):\n"
              "    y = jax.pure_callback(np.matmul, jax.ShapeDtypeStruct(x.shape[:1], x.dtype), x, g,\n"
              "                          vmap_method='sequential')\n"
              "    y = jax.lax.pcast(y, 'dp', to='varying')   # the result is per device\n"
              "    return jax.lax.psum((y * y).sum(), 'dp')\n"
              "rep = st.adapters.infer(f, g, x, mesh=mesh, in_specs=(P(), P('dp')), out_specs=P())\n"
              "if not rep.ok:\n"
              "    raise rep.violations[0]",
        when="FFI/Pallas kernels and pure_callback/io_callback inside shard_map with some inputs "
             "replicated and others sharded (NUFFTs, custom attention kernels, host-side samplers).",
        related=("SPMD407", "SPMD902"),
    ),
    ErrorPage(
        code="SPMD409", slug="nested-manual", title="shard_map nested over an axis already manual",
        headline="a shard_map inside another shard_map makes an axis manual that is manual already",
        rule="A nested shard_map makes manual only axes the enclosing shard_map left to the compiler.",
        meaning="Inside a shard_map body the manual axes are already per-device: the body sees one "
                "shard, and there is nothing left to split over them. JAX traces a nested shard_map over "
                "such an axis and then fails in the MLIR verifier (or with a mesh mismatch). Nest only over "
                "the axes the outer shard_map left automatic (`axis_names=`), or call the inner function "
                "directly on the shard.",
        fix="y = inner(x)   # already per device over the outer shard_map's manual axes",
        solutions=(
            "Call the inner per-shard function directly: its values are already the body's shards.",
            'Give the outer shard_map `axis_names={"dp"}` and the inner one `axis_names={"tp"}` to '
            "split the axes between them.",
        ),
        before='@st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))\n'
               'def outer(x):\n'
               '    return st.shard_map(lambda v: v * 2.0, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(x)\n'
               'y = outer(x)',
        after='@st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))\n'
              'def outer(x):\n'
              '    return x * 2.0                    # the body already holds the shard\n'
              'y = outer(x)',
        when="Reusing a function that calls st.shard_map itself from inside another shard_map body.",
        related=("SPMD503", "SPMD403"),
    ),
    ErrorPage(
        code="SPMD501", slug="unknown-axis", title="Unknown axis",
        headline="an axis name is not an axis of the mesh",
        rule="Every axis named in a collective, cast, spec or hint is an axis of the mesh.",
        meaning="Every axis named in a collective, cast or hint must be a manual axis of the enclosing "
                "shard_map's mesh. JAX reports a bare `AssertionError` or `NameError` for this.",
        fix='st.psum(x, "tp")   # an axis of the mesh',
        solutions=("Use one of the mesh's axis names (the message suggests the closest).",),
        before='y = st.psum(x, "tpp")   # x: Varying["tp"]',
        after='y = st.psum(x, "tp")',
        when="A typo, or an axis of another mesh.",
        related=("SPMD503",),
    ),
    ErrorPage(
        code="SPMD502", slug="bad-axes", title="Axis names in a form JAX rejects",
        headline="axis names were given in a form JAX does not accept",
        rule="Axis names are a str or a tuple of distinct str.",
        meaning="Axis names are a `str` or a tuple of `str` with no repeats. A set has no order (the order "
                "decides how a multi-axis collective flattens devices) and JAX rejects it.",
        fix='st.psum(x, ("dp", "tp"))',
        solutions=('Pass a tuple: `("dp", "tp")`.',),
        before='y = st.psum(x, {"dp", "tp"})',
        after='y = st.psum(x, ("dp", "tp"))',
        when="Sets or lists of axis names, repeated names.",
        related=("SPMD501",),
    ),
    ErrorPage(
        code="SPMD503", slug="non-manual-axis", title="Axis not manual here",
        headline="an axis is in the mesh but not manual in this shard_map",
        rule="Collectives and casts name only manual axes of the enclosing shard_map.",
        meaning="In a partial-manual shard_map (`axis_names=...`) only the listed axes are manual; the "
                "others are handled by the compiler and have no per-device state.",
        fix='st.psum(x, "dp")   # only manual axes; or add the axis to axis_names',
        solutions=("Add the axis to `axis_names`, or leave the collective over it to the compiler.",),
        before='@st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P(), axis_names={"dp"})\n'
               'def f(x):\n'
               '    return st.psum(x, ("dp", "tp"))     # tp is not manual here\n'
               'f(x)',
        after='@st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P(), axis_names={"dp"})\n'
              'def f(x):\n'
              '    return st.psum(x, "dp")             # tp is auto: x is not split over it\n'
              'f(x)',
        when="Partial-manual shard_map bodies that name an auto axis.",
        related=("SPMD501",),
    ),
    ErrorPage(
        code="SPMD504", slug="bad-hint", title="Malformed state hint",
        headline="a state hint is malformed",
        rule="A state hint names at least one axis and gives each axis exactly one state.",
        meaning='A hint names at least one axis per state, each axis once: `Varying["dp"]`, '
                '`Typed[Varying["dp"], Reduced["tp"]]`. One axis cannot be in two states, and a value '
                "cannot be Varying and Unreduced (or Reduced) on the same axis.",
        fix='st.Typed[st.Varying["tp"], st.Reduced["dp"]]',
        solutions=("Give each axis exactly one state.",),
        before='def f(x: st.Typed[st.Varying["dp"], st.Reduced["dp"]]): ...',
        after='def f(x: st.Typed[st.Varying["tp"], st.Reduced["dp"]]): ...',
        when="Empty subscriptions, repeated axes, non-string axis names, an axis in two states.",
    ),
    ErrorPage(
        code="SPMD505", slug="unknown-target", title="Unknown cast target",
        headline="an unknown `to=` target was given to a cast or all_gather",
        rule="The target of pcast is to='varying', 'reduced' or 'unreduced', and of all_gather 'varying', "
             "'invarying' or 'reduced'.",
        meaning='`pcast` takes `to="varying"|"reduced"|"unreduced"`; `all_gather` takes '
                '`to="varying"|"invarying"|"reduced"`.',
        fix='st.pcast(x, axis, to="varying")',
        solutions=(
            "Use one of the listed targets.",
            "Into Invariant needs a collective, and each computes different numbers: `st.psum` the sum "
            "of the devices' values, `st.pmean` their mean, `st.all_gather(x, axis, tiled=True, "
            'to="invarying")` the whole array. Pick the one the program means.',
        ),
        before='y = st.pcast(x, "dp", to="invariant")        # x: Varying["dp"]',
        after='y = st.psum(x, "dp")                         # Varying -> Invariant: a sum (or pmean, all_gather)',
        when="Typos, or asking a cast for a change only a collective can make.",
        related=("SPMD301",),
    ),
    ErrorPage(
        code="SPMD506", slug="outside-shard-map", title="Collective outside shard_map",
        headline="a typed collective was called outside shard_map",
        rule="Collectives and casts run only inside a function given to st.shard_map.",
        meaning="Collectives and casts act on manual mesh axes, which exist only inside the function given "
                "to `st.shard_map` (or `jax.shard_map`).",
        fix='st.shard_map(f, mesh=mesh, in_specs=P("dp"), out_specs=P())(x)',
        solutions=("Call it inside the shard_map'd function.",),
        before='y = st.psum(x, "dp")      # at top level',
        after='y = st.shard_map(lambda x: st.psum(x, "dp"), mesh=mesh, in_specs=P("dp"), out_specs=P())(x)',
        when="Calling a per-shard helper directly, e.g. from a test, without a shard_map around it.",
        related=("SPMD501",),
    ),
    ErrorPage(
        code="SPMD507", slug="custom-op-declaration", title="Malformed custom op declaration",
        headline="an st.custom_op declaration is malformed",
        rule="A custom op's `requires=` and `produces=` name known states, its own parameters and manual "
             "axes.",
        meaning="`requires=` is `{axis: state}` (every array argument) or `{parameter: {axis: state}}`; "
                '`produces=` is `{axis: state}` or a function of the input types. States are "invariant", '
                '"varying", "unreduced" or "reduced" (or `st.State` members), and every axis must be a '
                "manual axis of the enclosing shard_map.",
        fix='@st.custom_op(requires={"tp": "varying"})',
        solutions=("Fix the state name, axis or parameter name the message points at.",),
        before='@st.custom_op(requires={"tp": "vary"})\n'
               'def ring_allreduce(x): ...',
        after='@st.custom_op(requires={"tp": "varying"})\n'
              'def ring_allreduce(x): ...',
        when="Typos in state names, parameters that the function does not have, axes of another mesh.",
        related=("SPMD107", "SPMD501"),
    ),
    ErrorPage(
        code="SPMD508", slug="unknown-code", title="Unknown error code",
        headline="st.explain or st.allow was given a code that is not an spmdtyped error code (or one that "
                 "cannot be opted out of)",
        rule="The code given to st.explain is a known error code, and the code given to st.allow a strict one.",
        meaning="Codes are `SPMD###` (case-insensitive, or the number alone), the mypy name `spmd-<slug>` "
                "or the slug. Only the strict codes, where JAX accepts the program and computes a wrong or "
                "surprising result, can be opted out of with `st.allow`; every other code marks a program "
                "JAX rejects too.",
        fix='st.explain("SPMD101")',
        solutions=(
            "Use the code the message printed; `python -m spmdtyped explain` lists every code.",
            "For `st.allow`, pick one of the strict codes the message lists, or fix the program.",
        ),
        before='print(st.explain("SPMD1O1"))    # letter O\n'
               'with st.allow("SPMD101"): ...   # not a strict code',
        after='print(st.explain("SPMD101"))\n'
              'with st.allow("SPMD103"): ...   # a strict code',
        when="Typos in a code; opting out of a rule that JAX enforces too.",
        related=("SPMD103", "SPMD202"),
    ),
    ErrorPage(
        code="SPMD509", slug="bad-argument", title="Argument of the wrong type or value",
        headline="a public spmdtyped function was given an argument of the wrong type or out of range",
        rule="Every argument of a spmdtyped function has the type and range its documentation names.",
        meaning="spmdtyped checks each argument before using it: a mesh is a `jax.sharding.Mesh`, a "
                "function is callable, a spec is a `PartitionSpec` whose entries are axis names, `argnums` "
                "name positional arguments of the call, a permutation pairs device indices of the axis, "
                "and a dimension (`split_axis`, `scatter_dimension`, `axis`) is one of the operand's. The "
                "message names the argument, what it got and what it expects. Arguments that "
                "`st.numpy` passes on and `jax.numpy` rejects (an axis out of range, a float shape) "
                "are reported with JAX's message.",
        fix='st.shard_map(f, mesh=jax.make_mesh((2, 4), ("dp", "tp")), in_specs=P("dp"), out_specs=P())',
        solutions=("Pass the argument in the form the message names.",),
        before='st.shard_map(lambda x: x, mesh="dp", in_specs=P("dp"), out_specs=P("dp"))',
        after='st.shard_map(lambda x: x, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))',
        when="An axis name where a mesh is expected, `argnums` past the last argument, a permutation "
             "with an index outside the axis, an int in a PartitionSpec, a non-callable function.",
        related=("SPMD501", "SPMD502"),
    ),
    ErrorPage(
        code="SPMD901", slug="internal-mismatch", title="Rule table disagrees with JAX",
        headline="JAX computed a different state than spmdtyped's rule table predicted",
        rule="The state spmdtyped predicts for every result equals the state JAX computes.",
        meaning="Check mode (on by default) compares every collective's result with JAX's own type. A "
                "difference means the rule table is wrong for this JAX version: please report it with the "
                "message.",
        fix="with st.check_mode(False): ...   # until the rule table is fixed; please report the message",
        solutions=(
            "Report the message; meanwhile `with st.check_mode(False):` (or `st.set_check_mode(False)`) "
            "skips the comparison.",
        ),
        before='y = st.ppermute(x, "dp", perm)               # on a JAX whose rules changed',
        after="with st.check_mode(False):                   # until the rule table is fixed\n"
              '    y = st.ppermute(x, "dp", perm)',
        when="A JAX version whose rules changed.",
    ),
    ErrorPage(
        code="SPMD902", slug="custom-op-mismatch", title="Custom op result in an unreachable state",
        headline="a custom op's result is in a state its declaration cannot be reached from",
        rule="A custom op's result reaches its declared state from the state JAX computes through free "
             "casts only.",
        meaning="`st.custom_op` trusts its declaration and brings each result to the declared state with "
                "free casts (Invariant -> Varying/Reduced/Unreduced, Reduced -> Varying, Varying -> "
                "Unreduced), which cost nothing. A result JAX types as more varying than declared (Varying "
                "where the declaration says Invariant) cannot be cast: JAX has no free cast into Invariant,"
                " so the declaration would disagree with every later JAX check.",
        fix='@st.custom_op(produces={"dp": "varying"})',
        solutions=(
            "Build the kernel's outputs in the declared state (for pallas_call, ffi_call and pure_callback:"
            " result shapes with the declared `vma`).",
            "Declare the state JAX computes and reduce with a typed collective afterwards.",
            "For an undeclared `st.opaque` function that varies by itself (e.g. it calls axis_index), "
            'declare `produces={axis: "varying"}`.',
        ),
        before="noisy = st.opaque(lambda x: x + jax.lax.axis_index('dp'))(x)   # x: Invariant",
        after="noisy = st.custom_op(produces={'dp': 'varying'})(lambda x: x + jax.lax.axis_index('dp'))(x)",
        when="Opaque functions that use collectives or axis_index internally; kernels whose result types "
             "are built without the declared manual-axis state.",
        related=("SPMD901", "SPMD107"),
    ),
)

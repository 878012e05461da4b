"""The error catalogue, part 4: the pages of the communication report's flags (SPMD7xx).

Pure data, no JAX (like `_error_pages`): `_errors` builds `REGISTRY` from `PAGES` here too.
A flag is not raised while tracing: `st.report(...)` lists it, and `Report.check()` raises the
first one as a `CommunicationError`, for a CI job that must fail on a wasteful step.
"""

from __future__ import annotations

from .pages import ErrorPage

PAGES: tuple[ErrorPage, ...] = (
    ErrorPage(
        code="SPMD701", slug="reduction-in-loop", title="Reduction repeated in a loop",
        headline="a reduction inside a scan / fori_loop is only accumulated into the carry",
        rule="A sum that a loop only accumulates is reduced once, after the loop.",
        meaning="The loop all-reduces a value on every iteration and then only adds it to its "
                "carry. Sums commute: accumulate the per-device values instead (a Varying or "
                "Unreduced carry) and reduce the total once after the loop. The result is the "
                "same and the step sends 1/length of the bytes: the per-microbatch gradient "
                "all-reduce of gradient accumulation.",
        fix='acc = st.psum(jax.lax.scan(body_without_psum, acc0, xs)[0], "dp")',
        solutions=(
            "Make the parameter Reduced before the loop (`st.pcast(w, 'dp', to='reduced')`): its "
            "gradient is Unreduced, the carry accumulates it, one `st.psum` after the loop.",
            "Or differentiate with respect to `st.pvary(w, 'dp')` and `st.psum` the Varying "
            "accumulated gradient after the loop.",
            "Move an explicit `st.psum` from the loop body to the loop's result.",
        ),
        before='def step(w, xs):\n    def body(acc, x):\n        g = jax.grad(lambda w: jnp.sum(x @ w))(w)   # w Invariant: a psum per microbatch\n        return acc + g, None\n    return jax.lax.scan(body, jnp.zeros_like(w), xs)[0]\nf = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(None, "dp")), out_specs=P())\nst.report(f, w, xs).check()',
        after='def step(w, xs):\n    wr = jax.lax.pcast(w, "dp", to="reduced")   # its gradient is Unreduced\n    def body(acc, x):\n        return acc + jax.grad(lambda w: jnp.sum(x @ w))(wr), None\n    zero = jax.lax.pcast(jax.lax.pcast(jnp.zeros_like(w), "dp", to="varying"), "dp",\n                         to="unreduced")\n    return jax.lax.psum(jax.lax.scan(body, zero, xs)[0], "dp")   # once per step\nf = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(None, "dp")), out_specs=P())\nst.report(f, w, xs).check()',
        when="Gradient accumulation over microbatches with Invariant parameters; a `psum` of "
             "a metric inside the loop body; a ZeRO spec rebuilt without its `unreduced` tag.",
        related=("SPMD705",),
    ),
    ErrorPage(
        code="SPMD702", slug="collective-of-invariant", title="Collective of an Invariant value",
        headline="a collective communicates a value that is already Invariant on its axes",
        rule="A value that is the same on every device of an axis is not communicated over it.",
        meaning="The value is already the same on every device of the axis: JAX silently "
                "pvary-casts it and the collective sends bytes to compute what every device "
                "has (a psum of it multiplies by the axis size, an all_gather repeats it). "
                "spmdtyped's checker rejects it as SPMD103; the report shows what it costs in "
                "raw code.",
        fix="y = x * jax.lax.axis_size('dp')   # or drop the collective",
        solutions=(
            "Drop the collective: the value is already the same everywhere.",
            "If the multiplication by the axis size was meant, write it: "
            "`x * jax.lax.axis_size('dp')`.",
        ),
        before='def step(x):\n    s = jax.lax.psum(x, "dp")\n    return jax.lax.psum(s, "dp")   # s is already Invariant over dp\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P()), x).check()',
        after='def step(x):\n    return jax.lax.psum(x, "dp") * jax.lax.axis_size("dp")\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P()), x).check()',
        when="A second psum / pmean of an already reduced value; a psum of a parameter.",
        related=("SPMD701",),
    ),
    ErrorPage(
        code="SPMD703", slug="gather-into-opaque", title="All-gather feeding an opaque kernel",
        headline="an all-gather feeds an opaque kernel (a callback, custom call or Pallas kernel)",
        rule="An opaque kernel runs on the shard it is given, not on a gathered copy.",
        meaning="The kernel cannot be partitioned, so its operand is gathered to every device "
                "and each device runs it on the whole array: the gather's bytes and the "
                "kernel's work are both multiplied by the axis size.",
        fix="y = st.opaque(kernel)(x_shard)   # per shard, inside shard_map",
        solutions=(
            "Call the kernel per shard inside shard_map, with its states declared by "
            "`st.opaque` / `st.custom_op`.",
            "Give the kernel a sharding rule (`jax.experimental.custom_partitioning`, or "
            "`vmap_method` for a callback over a batch axis).",
        ),
        before='def step(x):\n    full = jax.lax.all_gather(x, "dp", tiled=True)\n    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(full.shape, full.dtype), full,\n                          vmap_method="sequential")\n    return y.sum()[None]\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")), x).check()',
        after='def step(x):\n    y = jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x,\n                          vmap_method="sequential")\n    return y.sum()[None]\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")), x).check()',
        when="A pure_callback / ffi_call / pallas_call fed a gathered or resharded-to-replicated "
             "array, often under an Explicit mesh where the gather is inserted by `reshard`.",
    ),
    ErrorPage(
        code="SPMD704", slug="psum-then-slice", title="psum followed by a slice",
        headline="a psum whose result is only sliced per device is a psum_scatter",
        rule="A sum of which each device keeps one slice is a reduce-scatter.",
        meaning="An all-reduce sends 2(n-1)/n of the array per device; a reduce-scatter sends "
                "(n-1)/n and leaves each device exactly its slice. Slicing the psum by the axis "
                "index throws away (n-1)/n of what was communicated.",
        fix="y = jax.lax.psum_scatter(x, 'dp', scatter_dimension=0, tiled=True)",
        solutions=(
            "Use `st.psum_scatter(x, axis, scatter_dimension=d, tiled=True)`.",
        ),
        before='def step(x):\n    i = jax.lax.axis_index("dp")\n    return jax.lax.dynamic_slice_in_dim(jax.lax.psum(x, "dp"), i * 2, 2)\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")), x).check()',
        after='def step(x):\n    return jax.lax.psum_scatter(x, "dp", scatter_dimension=0, tiled=True)\nst.report(jax.shard_map(step, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")), x).check()',
        when="Sequence / tensor parallel code that reduces activations and keeps a shard.",
        related=("SPMD701",),
    ),
    ErrorPage(
        code="SPMD705", slug="gradient-volume", title="Gradient all-reduce above the ideal",
        headline="the step all-reduces more gradient bytes than the parameters hold",
        rule="Data parallelism all-reduces each parameter's gradient once per step.",
        meaning="The ideal data-parallel step all-reduces the gradient of each replicated "
                "parameter once: 2(n-1)/n x the parameter bytes on the wire per device. More "
                "means a gradient is reduced per microbatch, twice, or at a larger shape.",
        fix="g = st.psum(accumulated_unreduced_grads, 'dp')   # once per step",
        solutions=(
            "Defer the reduction out of the microbatch loop (see SPMD701).",
            "Remove the second reduction of already-reduced gradients.",
            "Reduce a gathered weight's gradient at the shard's size: pvary the shard before "
            "the all_gather.",
            "Make a parameter used by several layers Varying once, before its uses.",
        ),
        before='def step(w, x):\n    loss = lambda w, x: jnp.sum(x @ w)\n    return jax.grad(loss)(w, x[:2]) + jax.grad(loss)(w, x[2:])   # two gradient psums\nst.report(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P()), w,\n          x).check()',
        after='def step(w, x):\n    return jax.grad(lambda w: jnp.sum(x @ w))(w)   # one gradient psum\nst.report(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P()), w,\n          x).check()',
        when="Gradient accumulation with Invariant parameters; a `psum` of gradients that "
             "autodiff already summed.",
        related=("SPMD701",),
    ),
)

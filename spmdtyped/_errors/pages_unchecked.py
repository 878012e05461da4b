"""The error catalogue, part 4: what a `check_vma=False` program computes (SPMD410-SPMD412).

With the checks off JAX records no state and its autodiff means something else; the walk of
the program that runs (`_engine.unchecked`) reports the gradients it leaves unsummed, sums
twice or computes from a partial cotangent. Pure data, like `_error_pages`.
"""

from __future__ import annotations

from .pages import ErrorPage

PAGES: tuple[ErrorPage, ...] = (
    ErrorPage(
        code="SPMD410", slug="unsummed-gradient", title="Gradient never summed under check_vma=False",
        headline="under check_vma=False, a gradient that differs per device reaches an output replicated "
                 "over that axis",
        rule="Under check_vma=False, the gradient of a value replicated over an axis is reduced over that "
             "axis (psum / pmean) before it reaches an output replicated over it.",
        meaning="With the checks on (`check_vma=True`), the gradient of a parameter replicated over 'dp' "
                "is summed over 'dp' by JAX's backward pass: the parameter meets per-device data through "
                "an implicit pvary, whose transpose is a psum. With `check_vma=False` JAX inserts no pvary, "
                "so nothing sums the gradient: each device holds the gradient of its own batch only. An "
                "out_spec replicated over 'dp' (P() for the gradients, or for the parameters they update) "
                "returns one device's: the step trains on 1/n of the batch, with no error. JAX's checked "
                "trace of the same body sums the gradient, so only the program that runs shows the bug; "
                "every face walks it (`typed_shard_map(..., check_vma=False)`, `st.shard_map(..., "
                "check_vma=False)`, `st.adapters.checking(step)`, `infer(..., check_vma=False)`).",
        fix='grads = jax.lax.pmean(grads, "dp")   # right after jax.grad, before the update',
        solutions=(
            "Reduce the gradients yourself: `jax.lax.pmean(grads, 'dp')` when each device's loss is "
            "the mean of its batch (the full-batch mean), `jax.lax.psum` when the loss is a sum.",
            "Or turn the checks on (`check_vma=True`): JAX then sums the gradient in the backward pass "
            "(the sum of the devices' gradients: average the loss with `jax.lax.pmean(loss, 'dp')` "
            "inside the differentiated function for the mean), and an explicit pmean of it is SPMD103.",
            "A per-device gradient kept on purpose is returned under an out_spec that names the axis "
            "(`P('dp')`): one per device, stacked.",
        ),
        before="def step(w, x):\n"
               "    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)\n"
               "    return g\n"
               "with jax.set_mesh(mesh):\n"
               "    g = st.adapters.typed_shard_map(step, in_specs=(P(), P('dp')), out_specs=P(),\n"
               "                                    check_vma=False)(w, x)",
        after="def step(w, x):\n"
              "    g = jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)\n"
              "    return jax.lax.pmean(g, 'dp')\n"
              "with jax.set_mesh(mesh):\n"
              "    g = st.adapters.typed_shard_map(step, in_specs=(P(), P('dp')), out_specs=P(),\n"
              "                                    check_vma=False)(w, x)",
        when="Data-parallel training steps written for check_vma=False (most production shard_map code "
             "opts out of the checks): the gradient all-reduce forgotten, or taken out while porting "
             "from check_vma=True code, where JAX did it.",
        related=("SPMD401", "SPMD103", "SPMD411"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD411", slug="psum-transposed-to-psum",
        title="psum differentiated under check_vma=False",
        headline="under check_vma=False, a psum inside a differentiated function transposes to a psum "
                 "of a cotangent equal on every device: the gradient is n times too large",
        rule="Under check_vma=False, a gradient taken inside the body does not flow through a psum whose "
             "result is the same on every device.",
        meaning="A psum's result is the same on every device, and so is the cotangent that flows back "
                "into it (the loss after a tensor-parallel all-reduce is replicated over 'tp'). With the "
                "checks on, JAX transposes the psum to a pvary: the cotangent passes through once. With "
                "`check_vma=False` it transposes to a psum (the pmap convention, where each device holds a "
                "part of the cotangent), which sums n equal copies: every gradient upstream of the psum "
                "is n times too large (jax#3970). A pmean divides by n first and stays right. A gradient "
                "taken outside the shard_map (`jax.grad` of the shard-mapped function) is right too: "
                "JAX divides the cotangent of a replicated output by n before the body's transpose.",
        fix="@jax.shard_map(..., check_vma=True)   # the psum transposes to a pvary",
        solutions=(
            "Turn the checks on (`check_vma=True`): the psum's transpose is then a pvary (no "
            "communication, no second sum).",
            "Keep check_vma=False and give the all-reduce an identity backward pass (Megatron's "
            "reduce-from-tensor-parallel region): `jax.custom_vjp` with `psum` forward and the "
            "cotangent returned as is. Where the column-parallel matmul's input is itself "
            "differentiated (layers stacked on each other), it needs the other half of the pair "
            "too: an identity forward whose backward psums the cotangent (Megatron's "
            "copy-to-tensor-parallel region); without it the earlier layers' gradients are wrong "
            "(SPMD412).",
            "Take the gradient outside the shard_map: `jax.grad` of the shard-mapped loss.",
            "If the mean over the axis was meant, `jax.lax.pmean`.",
        ),
        before="def step(w1, w2, x):\n"
               "    def loss(w1, w2):\n"
               "        return jnp.mean(jax.lax.psum(jnp.tanh(x @ w1) @ w2, 'tp') ** 2)\n"
               "    return jax.grad(loss, (0, 1))(w1, w2)\n"
               "with jax.set_mesh(mesh):\n"
               "    g1, g2 = st.adapters.typed_shard_map(\n"
               "        step, in_specs=(P(None, 'tp'), P('tp', None), P()),\n"
               "        out_specs=(P(None, 'tp'), P('tp', None)), check_vma=False)(w1, w2, x)",
        after="@jax.custom_vjp\n"
              "def all_reduce(y):\n"
              "    return jax.lax.psum(y, 'tp')\n"
              "all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))\n"
              "def step(w1, w2, x):\n"
              "    def loss(w1, w2):\n"
              "        return jnp.mean(all_reduce(jnp.tanh(x @ w1) @ w2) ** 2)\n"
              "    return jax.grad(loss, (0, 1))(w1, w2)\n"
              "with jax.set_mesh(mesh):\n"
              "    g1, g2 = st.adapters.typed_shard_map(\n"
              "        step, in_specs=(P(None, 'tp'), P('tp', None), P()),\n"
              "        out_specs=(P(None, 'tp'), P('tp', None)), check_vma=False)(w1, w2, x)",
        when="Tensor-parallel layers (a row-parallel projection's all-reduce) in a training step that "
             "takes its gradient inside a check_vma=False shard_map; a loss psum'd over the data axis "
             "before jax.grad (jax#3970).",
        related=("SPMD410", "SPMD412", "SPMD103"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD412", slug="partial-cotangent",
        title="Cotangent left partial under check_vma=False",
        headline="under check_vma=False, the cotangent of a value replicated over an axis is left a "
                 "partial sum on each device, and the gradient of a parameter sharded over that axis "
                 "is computed from it",
        rule="Under check_vma=False, the cotangent of a value replicated over an axis that meets "
             "per-device weights is summed over the axis before it reaches the gradient of a "
             "parameter sharded over it.",
        meaning="A column-parallel matmul takes a value replicated over 'tp' (a layer's input) and "
                "weights sharded over 'tp'. In the backward pass, each device's share of the "
                "input's cotangent comes from its own columns only: a partial sum. With the checks "
                "on, JAX's implicit pvary of the replicated input transposes to the psum that "
                "completes it; with `check_vma=False` nothing sums it, and every gradient computed "
                "from it (the earlier layers' weights, sharded over 'tp') is wrong, on every device, "
                "with no error: the loss and the last layer's gradients are right, so a smoke test "
                "passes. Megatron-LM's copy-to-tensor-parallel region is this psum written by hand; "
                "forgetting it while the reduce-from-tensor-parallel all-reduce is in place is the "
                "mistake. The walk of the program that runs (`_engine/unchecked.py`) reports it at "
                "the matmul whose input needed it.",
        fix="h = copy_to_tp(h)   # identity forward, jax.lax.psum(ct, 'tp') backward",
        solutions=(
            "Pass the replicated value through Megatron's copy-to-tensor-parallel region before "
            "the column-parallel matmul: a `jax.custom_vjp` that returns its input and whose "
            "backward pass is `jax.lax.psum(ct, 'tp')`.",
            "Or turn the checks on (`check_vma=True`): JAX inserts the pvary and its transpose "
            "sums the cotangent (drop the hand-written regions: the all-reduce's identity "
            "backward is then the pvary's, and a second psum would be SPMD103).",
        ),
        before="@jax.custom_vjp\n"
               "def all_reduce(y):\n"
               "    return jax.lax.psum(y, 'tp')\n"
               "all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))\n"
               "def step(w1, w2, x):\n"
               "    def loss(w1, w2):\n"
               "        h = x\n"
               "        for i in range(2):\n"
               "            h = h + all_reduce(jnp.tanh(h @ w1[i]) @ w2[i])\n"
               "        return jnp.mean(h ** 2)\n"
               "    return jax.grad(loss, (0, 1))(w1, w2)\n"
               "with jax.set_mesh(mesh):\n"
               "    g1, g2 = st.adapters.typed_shard_map(\n"
               "        step, in_specs=(P(None, None, 'tp'), P(None, 'tp', None), P()),\n"
               "        out_specs=(P(None, None, 'tp'), P(None, 'tp', None)), check_vma=False)(w1, w2, x)",
        after="@jax.custom_vjp\n"
              "def all_reduce(y):\n"
              "    return jax.lax.psum(y, 'tp')\n"
              "all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))\n"
              "@jax.custom_vjp\n"
              "def copy_to_tp(h):\n"
              "    return h\n"
              "copy_to_tp.defvjp(lambda h: (h, None), lambda _, ct: (jax.lax.psum(ct, 'tp'),))\n"
              "def step(w1, w2, x):\n"
              "    def loss(w1, w2):\n"
              "        h = x\n"
              "        for i in range(2):\n"
              "            h = h + all_reduce(jnp.tanh(copy_to_tp(h) @ w1[i]) @ w2[i])\n"
              "        return jnp.mean(h ** 2)\n"
              "    return jax.grad(loss, (0, 1))(w1, w2)\n"
              "with jax.set_mesh(mesh):\n"
              "    g1, g2 = st.adapters.typed_shard_map(\n"
              "        step, in_specs=(P(None, None, 'tp'), P(None, 'tp', None), P()),\n"
              "        out_specs=(P(None, None, 'tp'), P(None, 'tp', None)), check_vma=False)(w1, w2, x)",
        when="Tensor-parallel layers stacked in a training step that takes its gradient inside a "
             "check_vma=False shard_map, with the row-parallel all-reduce's identity backward in "
             "place and the column-parallel input's copy region forgotten (or dropped while "
             "porting from check_vma=True code, where JAX did its job).",
        related=("SPMD411", "SPMD410"),
        opt_out=True,
    ),
)

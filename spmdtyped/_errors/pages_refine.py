"""The error catalogue, part 3: the codes of the Shard / Partial refinement (DESIGN.md §1b).

JAX types all of these programs Varying and computes wrong numbers; spmdtyped's refinement of
Varying (`_refine`) sees that a value is a *partial sum* (Partial) or a *shard of a global
array* (Shard) and rejects the op that mixes them up. Pure data, like `_error_pages`.
"""

from __future__ import annotations

from .pages import ErrorPage

PAGES: tuple[ErrorPage, ...] = (
    ErrorPage(
        code="SPMD210", slug="partial-plus-replicated", title="Replicated term added to a partial sum",
        headline="a partial sum was combined with a replicated term before its reduction",
        rule="A partial sum over an axis is added only to partial sums over the same axis; a replicated "
             "term is added after the reduction.",
        meaning="A Partial value holds one device's term of a sum over the axis, for example `h @ w2` with "
                "the contracted dim sharded on both sides. Adding a replicated value (a bias, a literal, an "
                "Invariant or Rep value) to each term adds it once per device: after the reduction it is "
                "counted n times. This is the row-parallel bias bug of Megatron-LM and TGI. JAX types the "
                "partial sum Varying and accepts the program. The same holds for per-device contributions "
                "the refinement cannot call Partial (rows scatter-added into a zero buffer by a ring "
                "expert-parallel MoE, `jax.lax.ragged_dot` over locally routed tokens): a term replicated "
                "over the axis (Invariant, or the result of an `all_gather` over it) added right before "
                "their `psum` / `psum_scatter` over that axis is reported at the addition.",
        fix='st.psum(partial, axis) + b',
        solutions=(
            "Reduce first, then add: `st.psum(h @ w2, 'tp') + b`.",
            "Or add the term on one device only: `b * (st.axis_index('tp') == 0)` (rarely what is meant).",
        ),
        before='y = h @ w2 + b          # h: Shard["tp", -1], w2: Shard["tp", 0], b: Invariant',
        after='y = st.psum(h @ w2, "tp") + b',
        when="`+`, `-`, concatenate or stack of a Partial value with an Invariant, Reduced, Rep or literal "
             "value: a bias added inside a row-parallel layer, a replicated regulariser added to a local "
             "loss term; the residual (the gathered tokens) added to a MoE combine buffer before its "
             "`psum_scatter`.",
        related=("SPMD211", "SPMD212", "SPMD201"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD211", slug="partial-nonlinear", title="Non-linear op on a partial sum",
        headline="a non-linear op was applied to a partial sum",
        rule="Only linear ops (sums, scaling by a replicated factor, reshapes) apply to a partial sum before "
             "its reduction.",
        meaning="f(Σ_d x_d) ≠ Σ_d f(x_d) unless f is linear. JAX types a partial sum Varying and lets every "
                "op through; the result is not the op of the true value. The product of two partial sums "
                "and max/min/sort of one are not linear either.",
        fix="f(st.psum(partial, axis))",
        solutions=("Reduce first: `f(st.psum(p, axis))`.",
                   "If the contraction is local on purpose (a block-wise preconditioner, a per-shard "
                   "norm), say so: `st.local(p, axis)` forgets the refinement and binds nothing.",),
        before='y = st.numpy.tanh(h @ w2)     # a partial sum over "tp"',
        after='y = st.numpy.tanh(st.psum(h @ w2, "tp"))',
        when="An activation, softmax, max, sort, or a product of two partial sums, applied before the "
             "all-reduce of a row-parallel layer or of a vocab-parallel logit sum.",
        related=("SPMD202", "SPMD210"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD212", slug="partial-divisor", title="Division by a partial sum",
        headline="a value was divided by a partial sum",
        rule="A divisor is never a partial sum: reduce it first.",
        meaning="Each device divides by its local term instead of the total: a normaliser or a token count "
                "computed over a shard (the Megatron-LM loss-normalisation bugs, the attention-sink "
                "normaliser over TP-sharded heads).",
        fix="x / st.psum(d, axis)",
        solutions=("Reduce the divisor first: `x / st.psum(count, axis)`.",),
        before='loss = (l * mask).sum() / mask.sum()      # mask: Shard["dp", 0]',
        after='loss = st.psum((l * mask).sum(), "dp") / st.psum(mask.sum(), "dp")',
        when="`/` whose divisor is Partial over an axis: the sum of a sharded mask, of sharded exp-logits, "
             "of a sharded head dimension.",
        related=("SPMD211",),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD213", slug="partial-select", title="Partial sum selected per device",
        headline="a partial sum was selected by a predicate that varies over its axis",
        rule="A `where` selects between partial sums only with a predicate that is the same on every "
             "device of their axis.",
        meaning="Selecting per device between terms of a sum, with a different choice on each device, is "
                "not the selection of the total. Slicing per-device terms at this device's `axis_index` "
                "(`dynamic_slice_in_dim(acc, axis_index('ep') * n, n)` of a combine buffer the experts "
                "scatter-added their rows into, or of a Partial) is the reduction replaced by a slice: "
                "each device keeps only its own contributions; `psum_scatter` is what is meant.",
        fix="st.numpy.where(pred, st.psum(p, axis), q)",
        solutions=("Reduce the branches first, or make the predicate uniform over the axis.",),
        before='y = st.numpy.where(x > 0, p, 0.0)    # x varies over "tp", p partial over "tp"',
        after='y = st.numpy.where(x > 0, st.psum(p, "tp"), 0.0)',
        when="`where` with a Partial branch and a predicate Varying on the same axis.",
        related=("SPMD211", "SPMD202"),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD108", slug="shard-reduce", title="Shard of a global array summed over its own axis",
        headline="a shard of a global array (or its gradient) was summed over its own axis",
        rule="A `psum`/`pmean`/`psum_scatter` over an axis takes per-device terms or partial sums, never "
             "different slices of one array (or the gradients of different slices of one parameter) "
             "sharded over that axis.",
        meaning="The gradient of a Shard parameter is a Shard too: each device holds the gradient of its "
                "own slice (its own experts, its own rows). `psum`/`pmean` over the axis it is sharded on "
                "adds the gradients of different parameters elementwise: expert gradients reduced over "
                "the expert axis instead of the expert-data-parallel group. A value that an in_spec "
                "shards may as well be a stack of per-device terms, whose psum is right, so at run time "
                "a Shard is taken for a slice only where the program says so: it is a gradient (the "
                "results of `st.grad`/`jax.grad`/`jax.vjp` in the body and what ops make of them), the "
                "result of a tiled `psum_scatter` over the axis (FSDP's reduce-scatter followed by a "
                "mean over the data *and* fsdp axes), a replicated value sliced at `axis_index`, or an "
                "output that combines the sum with another input sharded over the axis is sharded "
                "over it again (an optimizer step `p - lr * pmean(g, ('dp', 'fsdp'))`, `p` and `g` "
                "both `P('fsdp')`); under "
                "`st.shard_map(..., strict=True)` every such sum. The mypy plugin, which does not follow "
                "gradients, reports it for every value a hint declares a Shard (`st.Shard[\"ep\", 0]`, "
                "an `\"e/ep\"` dim): a hint that names a sharded dim declares a slice of a global array.",
        fix="st.psum(g, axes_the_parameter_is_replicated_on)",
        solutions=(
            "Reduce over the axes the parameter is replicated on only: `st.psum(g, 'dp')`.",
            "Gather it if the whole gradient is meant: `st.all_gather(g, axis, axis=d, tiled=True)`.",
        ),
        before='g = st.psum(st.grad(lambda w: (w * w).sum())(w_experts), "tp")   # Shard["tp", 0]',
        after='g = st.grad(lambda w: (w * w).sum())(w_experts)   # each device owns its experts',
        when="`psum`/`pmean`/`psum_scatter` over an axis on which a gradient, a `psum_scatter`'s result "
             "or an input whose sum the out_spec shards again (with another input) is Shard(dim): the "
             "parameter was sharded over that axis by an in_spec, a hint or a `psum_scatter`.",
        related=("SPMD103",),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD215", slug="replicated-along-shard", title="Replicated values laid along a shard",
        headline="a replicated array was combined elementwise along a dim another operand has sharded",
        rule="Along a dim sharded over an axis, every operand is sharded the same way or constant: a "
             "replicated array there gives every device the same values for a different slice.",
        meaning="If `q` holds this device's heads (Shard over 'tp' on the heads dim), an Invariant per-head "
                "parameter sliced to the local count (`sinks[:h_local]`), or a RoPE table the step "
                "computes for the whole sequence and cuts to the local length (`cos[:n]`) on a "
                "sequence-sharded dim, give each device the values of the first slice. JAX accepts it; "
                "the result is wrong on every device but the first. Constants (`zeros`, `ones`, "
                "`full`, literals) are fine, and so, to the rule, are positions built at the local "
                "length (`arange(n)`): offset them by the device's index. The same holds for an "
                "index: token ids or labels replicated over tp that pick rows of an embedding "
                "table, or logits, sharded over tp on the vocabulary dim (`table[ids]`, "
                "`jnp.take_along_axis(logits, labels[..., None], -1)`) read the same local "
                "positions of every device's shard: the vocabulary-parallel lookup subtracts the "
                "shard's start, masks the ids outside it and psums the parts.",
        fix="x + p[st.axis_index(axis) * n : ...]   # or in_specs sharding p like x",
        solutions=(
            "Shard the parameter like the value: `in_specs=P('tp')` for per-head parameters.",
            "Slice it by the device's index: `lax.dynamic_slice_in_dim(p, st.axis_index('tp') * h, h)`.",
            "For ids into a vocabulary shard: `local = ids - st.axis_index('tp') * n`, look up "
            "`jnp.clip(local, 0, n - 1)`, zero the rows where `local` is outside [0, n), psum over tp.",
            "Opt out where it is meant: `with st.allow(\"SPMD215\"): ...`.",
        ),
        before='s = q_heads + sinks[:h]          # q_heads: Shard["tp", -2], sinks: Invariant',
        after='s = q_heads + sinks_local        # sinks_local: in_specs P("tp")',
        when="Per-head parameters (attention sinks, ALiBi slopes) or positions (RoPE) laid along a dim "
             "sharded over tp, sp or cp; global ids into a vocabulary-parallel embedding or "
             "cross-entropy.",
        related=("SPMD210",),
        opt_out=True,
    ),
    ErrorPage(
        code="SPMD216", slug="diagonal-block", title="Diagonal block of a product of two shards",
        headline="a product of two operands sharded over one axis along dims that stay apart in "
                 "the result reached an output alone",
        rule="A product of two operands sharded over one axis along dims that both stay in the "
             "result brings the other devices' blocks in before an output is computed from it.",
        meaning="If `q` and `k` are this device's blocks of a sequence sharded over 'sp', "
                "`einsum('bqd,bkd->bqk', q, k)` (inside `jax.nn.dot_product_attention` too) is "
                "the block of the scores on the diagonal: this device's queries against its own "
                "keys. The rest of each query's row, its scores against the other devices' keys, "
                "is computed nowhere, and the softmax and the weighted sum that follow use the "
                "local keys only. The same holds for tokens sharded over an axis times weights "
                "sharded over the same axis on their output dim (FSDP's all-gather of the "
                "weights forgotten), and for tokens times the experts of a MoE layer sharded "
                "over the tokens' axis without their `all_to_all`, and for the same table of pairs "
                "written elementwise (`(q[:, :, None] * k[:, None, :]).sum(-1)`, pairwise "
                "distances `x[:, None] - y[None, :]`). JAX types everything Varying "
                "and accepts it. Ring attention and the collective matmul start from exactly "
                "this block and combine it with the blocks a ring of `ppermute`s brings in "
                "(an `add`, `max`, `select` or `dynamic_update_slice` with a value computed "
                "from a `ppermute`, `all_gather` or `all_to_all` over the axis), so the engine "
                "reports the block only when an output of the body is computed from it without "
                "such a combination. It follows the block through the body, the functions it "
                "calls and its loops (a scan over layers makes it in its first layer), but not "
                "out of a loop whose body brings data in over the axis itself. The mypy plugin "
                "does not follow values to the outputs and does not report it.",
        fix="k = st.all_gather(k, axis, axis=d, tiled=True)   # the whole of the keys first",
        solutions=(
            "Gather the other operand over the axis first: `jax.lax.all_gather(k, 'sp', "
            "axis=1, tiled=True)` (and `v`): every device's queries against all keys.",
            "Or pass its blocks around a ring of `ppermute`s and combine each step's result "
            "with the running one (ring attention's online softmax).",
            "Opt out where a block-local product is meant (chunked local attention aligned "
            "with the shards): `with st.allow(\"SPMD216\"): ...`.",
        ),
        before="attend = lambda q, k, v: jax.nn.softmax(jnp.einsum('bqd,bkd->bqk', q, k), -1) @ v\n"
               "out = st.adapters.typed_shard_map(attend, mesh=mesh, in_specs=P('dp', 'sp'),\n"
               "                                  out_specs=P('dp', 'sp'))(q, k, v)",
        after="def attend(q, k, v):\n"
              "    k, v = (jax.lax.all_gather(a, 'sp', axis=1, tiled=True) for a in (k, v))\n"
              "    return jax.nn.softmax(jnp.einsum('bqd,bkd->bqk', q, k), -1) @ v\n"
              "out = st.adapters.typed_shard_map(attend, mesh=mesh, in_specs=P('dp', 'sp'),\n"
              "                                  out_specs=P('dp', 'sp'))(q, k, v)",
        when="Sequence or context parallelism whose attention forgets the ring or the "
             "all-gather of the keys and values; FSDP whose layer forgets to all-gather its "
             "weights; a MoE layer whose tokens never reach the devices of their experts.",
        related=("SPMD215", "SPMD211"),
        opt_out=True,
    ),
)

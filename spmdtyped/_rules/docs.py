"""Documentation tables: where spmdtyped is stricter or looser than JAX, and what JAX binds in
each collective's transpose. Read by the docs generator and the mypy plugin; no rule reads
them."""

from __future__ import annotations

STRICTER_THAN_JAX: tuple[tuple[str, str, str], ...] = (
    ("SPMD103", "collective over an axis where the input is Invariant",
     "JAX pvarys it: psum gives n·x, pmean of summed gradients is silently accepted"),
    ("SPMD104", "ppermute/all_gather/all_to_all/pmax(0.10) over axes in mixed Varying/Invariant "
     "states", "JAX pvarys the Invariant axes"),
    ("SPMD202", "cumsum/cumprod/flip/argmax/integer_pow/reciprocal/prod/take/.at[].set/"
     "sort/where on an Unreduced value", "JAX drops (or keeps) the Unreduced state: wrong numbers "
     "(jax 0.12.1 rejects most of them itself)"),
    ("SPMD401", "a Varying output under out_specs P(unreduced=...) (jax 0.10 casts it)",
     "jax 0.10 inserts vary_unreduced_cast; jax 0.12 rejects it"),
    ("SPMD203", "where(c, r, r) with c Invariant on r's reduced axes (and where(c, r, I) / "
     "where(c, I, r))", "JAX accepts (verified on 0.10.2 and 0.12.0.1 by the differential "
     "tests): select_n has no reduced check and takes R from the false branch only, so "
     "where(c, r, I) -> I and where(c, I, r) -> R; spmdtyped applies the n-ary reduced check"),
    ("SPMD201", "concatenate/stack of an Unreduced array with a non-Unreduced one",
     "JAX types the result Unreduced, so the other part is counted once per device"),
    ("SPMD203", "concatenate/stack of a Reduced array with an Invariant one",
     "JAX types the result Reduced; spmdtyped applies the add rule"),
    ("SPMD202", "pad(constant_values != 0), pad(mode='maximum'/'minimum'), astype(int from "
     "float, or bool), sum(dtype=int/bool) and sum/prod/max/min(where=...) of an Unreduced value",
     "JAX keeps (or drops) the Unreduced state: the constant is added once per device, the "
     "rounding or the mask is applied to the partial sums (issue 12)"),
    ("SPMD202", "a secondary argument (roll's shift, pad's constant_values, softmax's where, "
     "logsumexp's b, a reduction's where/initial, an .at[] index) that is Unreduced",
     "the op is not linear in it"),
    ("SPMD302", "st.cond/st.while_loop/st.fori_loop whose predicate or bounds vary: outputs and "
     "carries become Varying (an Unreduced one is rejected)",
     "JAX types such results Invariant although devices may take different paths"),
    # the refinement of Varying (DESIGN.md §1b): JAX sees Varying in every one of these
    ("SPMD108", "psum/pmean over an axis of a gradient that is a Shard over it (the gradient of "
     "a parameter an in_spec, a hint or a tiled psum_scatter sharded along that axis)",
     "JAX sums the gradients of different slices elementwise; other values (a stack of "
     "per-device terms) are not checked"),
    ("SPMD210", "a Partial value (a sum or mean over a Shard dim, a contraction of a dim sharded "
     "on both sides) plus or minus a replicated, literal or Shard value",
     "JAX types both Varying: the other term is counted once per device when reduced"),
    ("SPMD211", "a non-linear op on a Partial value, the product of two Partials, and "
     "softmax/log_softmax/logsumexp over a Shard dim", "JAX applies it to each device's term"),
    ("SPMD212", "division by a Partial value", "JAX divides by each device's local term"),
    ("SPMD213", "where on a Partial value with a predicate Varying on its axis",
     "JAX selects per device between terms of different sums"),
    ("SPMD215", "a replicated array (not a constant) laid along a dim another operand has "
     "sharded", "JAX gives every device the same values for a different slice"),
    ("SPMD216", "a product of two operands sharded over one axis along dims that both stay in "
     "the result (queries and keys of a sequence sharded over sp), reaching an output without "
     "the other devices' blocks combined in (the jaxpr walk only)",
     "JAX gives each device the diagonal block only: attention over the local keys"),
    # the walk of a check_vma=False program (`_engine/unchecked.py`): JAX checks nothing there
    ("SPMD410", "under check_vma=False, a gradient that differs per device (never psum'd or "
     "pmean'd over the axis) reaching an output replicated over that axis",
     "JAX returns one device's gradient (or the update it made)"),
    ("SPMD411", "under check_vma=False, a psum inside a differentiated function whose result is "
     "the same on every device", "JAX transposes it to a psum of n equal cotangents: the "
     "gradients upstream are n times too large (jax#3970)"),
    ("SPMD412", "under check_vma=False, the cotangent of a value replicated over an axis that "
     "meets weights sharded over it (a column-parallel matmul's input), never summed before it "
     "reaches the gradient of a parameter sharded over the axis", "JAX leaves each device a "
     "partial sum: the earlier layers' gradients are wrong (Megatron's copy-to-tensor-parallel "
     "region forgotten)"),
)

LOOSER_THAN_JAX: tuple[tuple[str, str], ...] = (
    ("Reduced value * / + - ** < <= > >= == != (any elementwise op but @) Python scalar",
     "the scalar is cast to Reduced (`pcast(jnp.asarray(c), axes, to='reduced')`); JAX rejects "
     "`r * 2.0`, `r < 0.5`"),
    ("Unreduced value * or / Python scalar", "the scalar is cast to Reduced, then U × R → U; "
     "JAX rejects `u * 2.0`; on jax 0.10 `u / c` is bound as `u * (1/c)`"),
    ("mean over local dimensions of a Reduced or Unreduced value", "sum, then the scalar rule "
     "above; `jnp.mean(r)` fails in JAX"),
    ("sort/cumprod/nn.sigmoid/nn.silu of a Reduced value", "bound on the value cast to Varying "
     "(`pcast(to='varying')`, free), so the result is Varying: JAX types the op Reduced but "
     "cannot lower it (jax 0.10.2 and 0.12.0.1; jax 0.12.1 rejects cumprod of a Reduced "
     "value while tracing)"),
    ("st.pbroadcast on CPU", "bound as the equivalent JAX documents (psum of the source's "
     "shard, then a cast to Varying): jax.lax.pbroadcast has no CPU lowering"),
)


#: forward op -> the primitive(s) JAX binds in its transpose (reference §5); cotangent states
#: follow `cotangent`. For the docs and the plugin; the runtime lets JAX transpose.
TRANSPOSES: dict[str, str] = {
    "psum": "pvary", "pvary": "psum", "pcast_varying": "psum (from Invariant) / "
    "pcast_unreduced (from Reduced)", "pcast_reduced": "psum (of the Unreduced cotangent)",
    "pcast_unreduced": "pcast_varying (Reduced -> Varying)", "all_gather": "psum_scatter",
    "psum_scatter": "all_gather (all_gather_reduced on an Unreduced input)",
    "all_gather_invarying": "dynamic_slice at axis_index", "all_gather_reduced":
    "psum_scatter of the Unreduced cotangent", "ppermute": "ppermute (inverse permutation)",
    "all_to_all": "all_to_all (split and concat axes swapped)",
}


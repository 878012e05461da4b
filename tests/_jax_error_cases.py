"""Programs that make JAX raise each of its manual-axis errors (tests/test_porting_jax_errors.py).

Each takes one f32[8, 8] argument sharded P("dp", "tp") on a (dp=2, tp=4) mesh."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from spmdtyped import _compat

lax = jax.lax


def reduced_psum(x):
    r = lax.pcast(jnp.sum(lax.psum(x, ("dp", "tp"))), "tp", to="reduced")
    return lax.psum(r, "tp")


def unreduced_pmax(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.pmax(u, "tp")


def mixed_axes(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(u, ("dp", "tp"))


def unreduced_tanh(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(jnp.tanh(u), "tp")


def unreduced_mul(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(u * u, "tp")


def unreduced_dot(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(u @ u.T, "tp")


def unreduced_div(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(u / u, "tp")


def unreduced_plus_varying(x):
    u = lax.pcast(x, "tp", to="unreduced")
    y = u + x
    return lax.psum(y, "tp")


def reduced_plus_invariant(x):
    s = lax.psum(x, ("dp", "tp"))
    r = lax.pcast(s, "tp", to="reduced")
    return r + s


def reduced_mismatch(x):
    s = lax.psum(x, ("dp", "tp"))
    return lax.pcast(s, "tp", to="reduced") + lax.pcast(s, "dp", to="reduced")


def double_unreduced_cast(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(lax.pcast(u, "tp", to="unreduced"), "tp")


def scan_carry(x):
    def body(i, c):
        return c + x

    return lax.psum(lax.fori_loop(0, 3, body, jnp.zeros_like(lax.psum(x, ("dp", "tp")))),
                    ("dp", "tp"))


def cond_branches(x):
    s = lax.psum(x, ("dp", "tp"))
    return lax.psum(lax.cond(s.sum() > 0, lambda: x, lambda: s), ("dp", "tp"))


def varying_output(x):
    return x


def gather_reduced_invariant(x):
    s = lax.psum(x, ("dp", "tp"))
    return lax.all_gather(s, "tp", axis=1, tiled=True, to="reduced")


def varying_cotangent(x):
    # the pullback of all_gather(to="reduced") is JAX's unreduced_psum_scatter: its cotangent
    # must be Unreduced over tp, and an all_gather's result is Varying
    full, pull = jax.vjp(lambda v: lax.all_gather(v, "tp", axis=1, tiled=True, to="reduced"), x)
    (g,) = pull(lax.all_gather(x, "tp", axis=1, tiled=True))
    return g


def unreduced_scaled(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(u * 2.0, "tp")


def unreduced_cumsum(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(jnp.cumsum(u, axis=1), "tp")


def unreduced_sort(x):
    u = lax.pcast(x, "tp", to="unreduced")
    return lax.psum(jnp.sort(u, axis=1), "tp")


def reduced_cumsum(x):
    r = lax.pcast(lax.psum(x, ("dp", "tp")), "tp", to="reduced")
    return lax.pcast(jnp.cumsum(r, axis=1), "tp", to="varying")


def reduced_pad(x):
    r = lax.pcast(lax.psum(x, ("dp", "tp")), "tp", to="reduced")
    return lax.pcast(jnp.pad(r, 1), "tp", to="varying")


def reduced_dynamic_slice(x):
    r = lax.pcast(lax.psum(x, ("dp", "tp")), "tp", to="reduced")
    i = lax.axis_index("dp")
    return lax.pcast(lax.dynamic_slice_in_dim(lax.pcast(r, "dp", to="varying"), i, 4), "tp",
                     to="varying")


_OLD = jax.__version__ < "0.11"
#: name -> (function, out_specs, the code of JAX's message (`_jax_errors.translate`), the code
#: typed_shard_map and infer report: spmdtyped's own check, when it fires before JAX's)
CASES = {
    "reduced_psum": (reduced_psum, P(), "SPMD101", "SPMD101"),
    # (the tools raise JAX's error translated: nothing routes jax.lax.pmax through spmdtyped)
    "unreduced_pmax": (unreduced_pmax, P("dp"), "SPMD102" if _OLD else "SPMD106",
                       "SPMD102" if _OLD else "SPMD106"),
    "mixed_axes": (mixed_axes, P(), "SPMD104", "SPMD104"),
    "unreduced_tanh": (unreduced_tanh, P("dp"), "SPMD202", "SPMD202"),
    "unreduced_mul": (unreduced_mul, P("dp"), "SPMD202", "SPMD202"),
    "unreduced_dot": (unreduced_dot, P("dp"), "SPMD202", "SPMD202"),
    "unreduced_div": (unreduced_div, P("dp"), "SPMD202", "SPMD202"),
    "unreduced_plus_varying": (unreduced_plus_varying, P("dp"), "SPMD201", "SPMD201"),
    "reduced_plus_invariant": (reduced_plus_invariant, P(), "SPMD203", "SPMD203"),
    "reduced_mismatch": (reduced_mismatch, P(), "SPMD204", "SPMD204"),
    "double_unreduced_cast": (double_unreduced_cast, P("dp"), "SPMD301", "SPMD301"),
    "scan_carry": (scan_carry, P(), "SPMD302", "SPMD302"),
    "cond_branches": (cond_branches, P(), "SPMD302", "SPMD302"),
    "varying_output": (varying_output, P(), "SPMD401", "SPMD401"),
    "gather_reduced_invariant": (gather_reduced_invariant, P(), "SPMD103", "SPMD103"),
    "varying_cotangent": (varying_cotangent, P("dp", "tp"), "SPMD404", "SPMD404"),
    "unreduced_scaled": (unreduced_scaled, P("dp"), "SPMD201", "SPMD201"),
}
if _compat.FEATURES.no_rule_rejects:  # the checks jax 0.12.1 added
    CASES.update({
        "unreduced_cumsum": (unreduced_cumsum, P("dp"), "SPMD202", "SPMD202"),
        "unreduced_sort": (unreduced_sort, P("dp"), "SPMD202", "SPMD202"),
        # (JAX's one message for both states: its rule's operands tell the Reduced one)
        "reduced_cumsum": (reduced_cumsum, P("dp", "tp"), "SPMD203", "SPMD203"),
        "reduced_pad": (reduced_pad, P("dp", "tp"), "SPMD203", "SPMD203"),
        "reduced_dynamic_slice": (reduced_dynamic_slice, P("dp", "tp"), "SPMD205", "SPMD205"),
    })

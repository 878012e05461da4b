"""`python -m spmdtyped demo`: a typed dp x tp MLP on 8 simulated CPU devices.

Prints the state of every value as it flows through one forward/backward step, checks the
result against a single-device computation, then shows one caught mistake with its message.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _setup_devices(n: int) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if "jax" in sys.modules:
        import jax

        if jax.device_count() < n:
            raise SystemExit(f"the demo needs {n} devices; set XLA_FLAGS before importing jax")


def run(verbose: bool = True) -> dict[str, Any]:
    """Run the demo; returns the typed and reference results (used by tests)."""
    _setup_devices(8)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import spmdtyped as st
    from spmdtyped import Varying

    out = print if verbose else (lambda *a, **k: None)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    out(f"mesh: {dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))} on {jax.device_count()} "
        f"{jax.devices()[0].platform.upper()} devices, jax {jax.__version__}\n")

    batch, d, hidden = 8, 16, 32
    kx, k1, k2, ky = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(kx, (batch, d))
    w1 = jax.random.normal(k1, (d, hidden)) / d**0.5
    w2 = jax.random.normal(k2, (hidden, d)) / hidden**0.5
    y = jax.random.normal(ky, (batch, d))

    def put(a: Any, spec: P) -> Any:
        return jax.device_put(a, NamedSharding(mesh, spec))

    trace: list[tuple[str, str, tuple[int, ...]]] = []

    def show(name: str, v: Any) -> Any:
        trace.append((name, str(st.typeof(v)), tuple(v.shape)))
        return v

    specs = (P("dp"), P(None, "tp"), P("tp", None), P("dp"))

    @st.shard_map(mesh=mesh, in_specs=specs, out_specs=(P(), P("dp")))
    def step(x: Varying["dp"], w1: Varying["tp"], w2: Varying["tp"], y: Varying["dp"]):  # type: ignore[no-untyped-def]
        show("x", x)
        show("w1", w1)
        show("w2", w2)
        h = show("h = x @ w1", x @ w1)
        a = show("a = tanh(h)", st.numpy.tanh(h))
        partial = show("p = pcast(a @ w2, unreduced)", st.pcast(a @ w2, "tp", to="unreduced"))
        pred = show("pred = psum(p, 'tp')", st.psum(partial, "tp"))
        err = show("e = pred - y", pred - y)
        local = show("l = mean(e * e)", (err * err).mean())
        loss = show("loss = pmean(l, 'dp')", st.pmean(local, "dp"))
        return loss, pred

    loss, pred = jax.jit(step)(put(x, specs[0]), put(w1, specs[1]), put(w2, specs[2]),
                               put(y, specs[3]))
    out(f"{'value':30s} {'state':40s} local shape")
    for name, state, shape in trace:
        out(f"{name:30s} {state:40s} {shape}")

    ref_pred = jnp.tanh(x @ w1) @ w2
    ref_loss = jnp.mean((ref_pred - y) ** 2)
    np.testing.assert_allclose(np.asarray(pred), np.asarray(ref_pred), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    out(f"\nloss {float(loss):.6f} == single-device reference {float(ref_loss):.6f}\n")

    # One caught mistake: ZeRO-style parameters gathered as Reduced, then summed again.
    out("A mistake spmdtyped catches before JAX binds anything:\n")
    out('    w = st.all_gather(w_shard, "dp", to="reduced")   # Reduced["dp"]')
    out('    g = st.psum(w, "dp")                             # summing a reduced value\n')

    @st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P())
    def broken(w_shard: Varying["dp"]):  # type: ignore[no-untyped-def]
        w = st.all_gather(w_shard, "dp", to="reduced", tiled=True)
        return st.psum(w, "dp")

    caught = None
    try:
        broken(put(w1, P("dp")))
    except st.SpmdTypeError as e:
        caught = e
        out(str(e))
    if caught is None:
        raise SystemExit("demo: the mistake was not caught")
    return {"trace": trace, "loss": float(loss), "ref_loss": float(ref_loss), "error": caught}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdtyped demo", description=__doc__)
    parser.parse_args(argv)
    run(verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

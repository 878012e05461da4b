"""Scale-out: the typed transformer step on JAX's multi-controller runtime.

Run one copy per process; each process owns 4 simulated CPU devices, the 2 processes form the
same dp=2 x tp=4 mesh as the single-process examples, and collectives between processes go
through gloo:

    python examples/multiprocess.py --process-id 0 --num-processes 2 --port 12355 --out r0.json &
    python examples/multiprocess.py --process-id 1 --num-processes 2 --port 12355 --out r1.json

The same code runs on a real multi-host cluster: only `jax.distributed.initialize`'s
arguments change (or none, where the cluster environment is detected). Results are written as
JSON (losses and parameter checksums) and equal the single-process run's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)

    local = 8 // args.num_processes
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={local}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{args.port}",
                               num_processes=args.num_processes, process_id=args.process_id)
    try:
        result = run_steps(args.steps)
    finally:
        jax.distributed.shutdown()
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


def run_steps(steps: int) -> dict[str, object]:
    """`steps` typed training steps on the global dp x tp mesh; works with 1 or more processes."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    from examples import transformer

    mesh = transformer.make_mesh()

    def put(a, sharding):  # type: ignore[no-untyped-def]
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])

    params, x, y = transformer.make_inputs(mesh, put=put)
    typed, _ = transformer.programs(mesh)
    losses = []
    for _ in range(steps):
        params, loss = typed(params, x, y)
        # a replicated scalar: every process holds the same value
        losses.append(float(np.asarray(multihost_utils.process_allgather(loss, tiled=True))))
    full = multihost_utils.process_allgather(params, tiled=True)
    checksums = [float(np.asarray(w, np.float64).sum()) for w in jax.tree_util.tree_leaves(full)]
    return {"processes": jax.process_count(), "devices": jax.device_count(), "losses": losses,
            "checksums": checksums}


if __name__ == "__main__":
    sys.exit(main())

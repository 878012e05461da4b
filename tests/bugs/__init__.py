"""Real distributed-training bugs ported to `jax.shard_map`, each as BUGGY / FIXED / REFERENCE.

Every module here has the same interface (checked by `tests/test_bug_suite.py`):

- `MESH_AXES`: the mesh, `{axis name: size}`, 8 devices in all.
- `SOURCE`: where the bug comes from (issue, PR, code base).
- `KIND`: `"forward"` (the value is wrong) or `"grad"` (the gradient is wrong).
- `IN_SPECS`, `OUT_SPECS`: the specs of the per-device bodies; `mesh`: the `jax.sharding.Mesh`.
- `buggy_body`, `fixed_body`: the raw per-device functions (what `infer` walks); the one
  line of `buggy_body` (or a function it calls) that carries the bug ends in `# BUG`.
- `make_inputs()`: the global inputs (fixed PRNG keys, float32, tiny shapes).
- `buggy(*inputs)`, `fixed(*inputs)`: the quantity the program computes (the forward value, or
  for `KIND == "grad"` the gradient), run on the mesh.
- `reference(*inputs)`: the same quantity computed with plain `jax.numpy` on one device.
- `JAX_REJECTS`: `None` when JAX runs `buggy` and computes wrong numbers, else the exception
  class JAX raises for it (the bug is then already caught by JAX itself).

The package is imported as `bugs` (pytest puts `tests/` on `sys.path`); standalone:
`PYTHONPATH=tests python -c "import bugs.row_parallel_bias as m; print(m.buggy(*m.make_inputs()))"`.
`bug_location(module)` gives the file and line of the `# BUG` line.
"""

import os as _os
import sys as _sys

if "jax" not in _sys.modules:  # standalone runs; under pytest, conftest.py has done this
    _os.environ["XLA_FLAGS"] = (
        _os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    _os.environ.setdefault("JAX_PLATFORMS", "cpu")

BUG_CLASSES = (
    "row_parallel_bias",
    "token_count_normaliser",
    "mean_of_means",
    "attention_sink_heads",
    "grad_norm_overcount",
    "grad_clip_local_norm",
    "expert_grads_wrong_group",
    "vocab_ce_missing_reduction",
    "vocab_ce_doubled_reduction",
    "cond_axis_index_grad",
    "per_example_grads_vmap",
    "custom_kernel_replicated_grad",
    "layernorm_sharded_hidden",
    "softmax_vocab_sharded",
)


def bug_location(module) -> tuple[str, int]:
    """`(file, line)` of the one `# BUG` line of a bug module: where a typed error must fire."""
    import inspect

    path = inspect.getsourcefile(module)
    lines = [i for i, text in enumerate(open(path).read().splitlines(), 1)
             if text.rstrip().endswith("# BUG")]
    if len(lines) != 1:
        raise ValueError(f"{path}: expected one '# BUG' line, found {len(lines)}")
    return path, lines[0]

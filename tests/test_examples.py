"""Every example runs and matches its raw twin and single-device reference; every broken twin
is rejected at trace time with the code marked `# expect: SPMD###` on its offending line; the
2-process scale-out run equals the 1-process run; the raw ring-attention loop needs the cast
`st.fori_loop` inserts; the ZeRO-3 states along one step."""

import importlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT))

from examples import ring_attention, zero3  # noqa: E402

#: examples that define `run()`; transformer and multiprocess are tested separately
RUNNABLE = sorted(p.stem for p in EXAMPLES.glob("*.py")
                  if p.stem not in ("transformer", "multiprocess") and not p.stem.startswith("_"))
BROKEN = sorted(p.stem for p in (EXAMPLES / "broken").glob("*_broken.py"))
_EXPECT = re.compile(r"#\s*expect:\s*(SPMD\d{3})")


def expected_codes(path: Path) -> list[tuple[int, str]]:
    """(line, code) of every `# expect: SPMD###` marker in a file."""
    return [(i, m.group(1)) for i, line in enumerate(path.read_text().splitlines(), 1)
            if (m := _EXPECT.search(line))]


@pytest.mark.parametrize("name", RUNNABLE)
def test_example_runs(name):
    mod = importlib.import_module(f"examples.{name}")
    result = mod.run()
    # each example's own check against its raw twin and reference is repeated here, so that
    # a run() that stops checking (or returns a larger error) fails this test
    if "max_abs_err" in result:
        assert result["max_abs_err"] < 1e-4, result
    elif "reference_losses" in result:  # the ecosystem examples: the loss curve of the reference
        np.testing.assert_allclose(result["losses"], result["reference_losses"], rtol=2e-4)
        assert result["losses"][-1] < result["losses"][0], result
    else:
        assert result["last_loss"] < result["first_loss"], result


def test_every_example_has_a_broken_twin():
    good = {p.stem for p in EXAMPLES.glob("*.py") if p.stem != "multiprocess" and not p.stem.startswith("_")}
    twins = {b.removesuffix("_broken") for b in BROKEN}
    assert good <= twins, f"examples without a broken twin: {sorted(good - twins)}"


@pytest.mark.parametrize("name", BROKEN)
def test_broken_twin_rejected_at_runtime(name):
    path = EXAMPLES / "broken" / f"{name}.py"
    markers = expected_codes(path)
    assert len(markers) == 1, f"{path} needs exactly one '# expect: SPMD###' marker"
    (line, code), = markers
    mod = importlib.import_module(f"examples.broken.{name}")
    with pytest.raises(st.SpmdTypeError) as ei:
        mod.run_broken()
    assert ei.value.code == code, str(ei.value)
    # the error is raised from the marked line of the broken file
    frames = [f for f in _traceback_frames(ei.value.__traceback__) if f[0] == str(path)]
    assert frames and frames[-1][1] == line, (frames, line)


def _traceback_frames(tb):
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


def test_transformer_trains_and_matches_raw_and_reference():
    from examples import transformer

    result = transformer.train(steps=40, verbose=False, check_every=20)
    losses = result["losses"]
    assert losses[-1] < 0.5 * losses[0]


def test_transformer_type_trace():
    from examples import transformer

    trace = dict((name, state) for name, state, _ in transformer.trace_step(transformer.make_mesh()))
    assert trace["q = x @ wq"] == "Varying['dp', 'tp']"
    assert trace["o @ wo (partial)"] == "Typed[Varying['dp'], Unreduced['tp']]"
    assert trace["x + psum(o @ wo)"] == "Varying['dp']"
    assert trace["loss = pmean(mean(err²), 'dp')"] == "Invariant"
    assert trace["grad wq"] == "Varying['tp']"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_equal_one_process(tmp_path):
    """2 processes x 4 CPU devices (jax.distributed on 127.0.0.1, gloo) == 1 process x 8."""
    from examples import multiprocess

    steps = 3
    single = multiprocess.run_steps(steps)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    procs = [subprocess.Popen([sys.executable, str(EXAMPLES / "multiprocess.py"), "--process-id", str(i),
                               "--num-processes", "2", "--port", str(port), "--steps", str(steps),
                               "--out", str(tmp_path / f"r{i}.json")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    deadline = time.monotonic() + 240
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    results = [json.loads((tmp_path / f"r{i}.json").read_text()) for i in range(2)]
    for r in results:
        assert r["processes"] == 2 and r["devices"] == 8
        assert r["losses"] == pytest.approx(single["losses"], rel=1e-6)
        assert r["checksums"] == pytest.approx(single["checksums"], rel=1e-5)


# ------------------------------------------------------------------ ring attention and ZeRO-3


def test_ring_attention_raw_loop_needs_the_hand_written_cast():
    """Without the pcast that st.fori_loop inserts, JAX rejects the raw loop."""
    mesh = ring_attention.make_mesh()
    q, k, v = ring_attention.make_inputs(mesh)

    def no_cast(q, k, v):
        def step(i, c):
            m, o = c
            s = jnp.einsum("bqd,bkd->bqk", q, k)
            return jnp.maximum(m, jnp.max(s, axis=-1)), o
        m, o = jax.lax.fori_loop(0, 4, step, (jnp.full(q.shape[:-1], -jnp.inf), jnp.zeros_like(q)))
        return o

    spec = ring_attention.SPEC
    with pytest.raises(TypeError, match="carry input and carry output must have equal types"):
        jax.jit(jax.shard_map(no_cast, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)).trace(q, k, v)


def test_zero3_states_along_the_step():
    mesh = zero3.make_mesh()
    params, x, y = zero3.make_inputs(mesh)
    seen = {}

    def step(shards, x, y):
        full = {k: st.all_gather(s, "dp", tiled=True, to="reduced") for k, s in shards.items()}
        loss, grads = st.value_and_grad(zero3.loss_fn)(full, x, y)
        seen.update(shard=type(shards["w1"]), full=type(full["w1"]), loss=type(loss),
                    grad=type(grads["w1"]))
        g = {k: st.psum_scatter(v, "dp", tiled=True) for k, v in grads.items()}
        seen["g_shard"] = type(g["w1"])
        # the double reduction that data-parallel code often has: rejected
        with pytest.raises(st.AxisStateError) as e:
            st.psum(st.psum(grads["w1"], "dp"), "dp")
        seen["double"] = e.value.code
        return {k: shards[k] - g[k] for k in shards}

    jax.jit(st.shard_map(step, mesh=mesh, in_specs=(zero3.PARAM_SPECS, zero3.DATA_SPEC,
                                                    zero3.DATA_SPEC),
                         out_specs=zero3.PARAM_SPECS)).trace(params, x, y)
    assert seen == {"shard": st.Varying["dp"], "full": st.Reduced["dp"], "loss": st.Varying["dp"],
                    "grad": st.Unreduced["dp"], "g_shard": st.Varying["dp"], "double": "SPMD103"}


def test_zero3_with_reduced_in_specs():
    """The other way to hold ZeRO parameters: `P(reduced=...)` arguments (Explicit mesh)."""
    mesh = zero3.make_mesh()
    _, x, y = zero3.make_inputs(mesh)
    w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P(reduced={"dp"})))
    seen = {}

    def step(w, x, y):
        seen["w"] = type(w)
        g = st.grad(lambda w, x, y: st.numpy.mean((x @ w - y) ** 2))(w, x, y)
        seen["g"] = type(g)
        return st.psum_scatter(g, "dp", tiled=True)

    out = jax.jit(st.shard_map(step, mesh=mesh, in_specs=(P(reduced={"dp"}), zero3.DATA_SPEC,
                                                          zero3.DATA_SPEC),
                               out_specs=P("dp")))(w, x, y)
    assert seen == {"w": st.Reduced["dp"], "g": st.Unreduced["dp"]}
    xs, ys = np.asarray(x).reshape(8, 2, 16), np.asarray(y).reshape(8, 2, 8)
    ref = sum(np.asarray(jax.grad(lambda w, a, b: jnp.mean((a @ w - b) ** 2))(jnp.ones((16, 8)), a, b))
              for a, b in zip(xs, ys, strict=False))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)

"""`port --enable-vma --run FUNC`: the shard_maps a model writes inside its own functions.

Production models keep their `jax.shard_map(..., check_vma=False)` calls inside the functions
that use them (jax-ml/jax-llm-examples' `model.py`: `@partial(jax.shard_map, mesh=cfg.mesh,
in_specs=in_specs, ..., check_vma=False)` on a `def _f` inside `attention`, the specs built
there). No module-level call says what the mesh, the specs or the shapes are; running the
code does. `--run FUNC` calls a function of the first file once and migrates every
shard_map that the files given make while it runs. Each migrated program is run: output and
gradient against the original and against one device.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import module_project
from test_migrate_vma import CUSTOM_VJP

from spmdtyped import _compat
from spmdtyped._cli import port as _port_cli

#: a decoder as jax-llm-examples writes one: the mesh in a config, each shard_map a decorator
#: inside the layer's function, its specs built there; an online softmax whose running max,
#: sum and output start as constants (Invariant; the loop makes them Varying)
MODEL = '''import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class Config:
    mesh: jax.sharding.Mesh
    block: int = 4


def attention(q, k, v, cfg: Config):
    scale = q.shape[-1] ** -0.5
    spec = P("dp", "tp", None, None)   # batch over dp, heads over tp

    @partial(jax.shard_map, mesh=cfg.mesh, in_specs=(spec, spec, spec), out_specs=spec,
             check_vma=False)
    def _f(q, k, v):
        blocks = k.shape[-2] // cfg.block

        def body(i, carry):
            m, s, o = carry
            kb = jax.lax.dynamic_slice_in_dim(k, i * cfg.block, cfg.block, axis=-2)
            vb = jax.lax.dynamic_slice_in_dim(v, i * cfg.block, cfg.block, axis=-2)
            logits = jnp.einsum("bhqd,bhkd->bhqk", q * scale, kb)
            m_new = jnp.maximum(m, logits.max(-1))
            p = jnp.exp(logits - m_new[..., None])
            corr = jnp.exp(m - m_new)
            return m_new, s * corr + p.sum(-1), o * corr[..., None] + p @ vb

        init = (jnp.full(q.shape[:-1], -jnp.inf), jnp.zeros(q.shape[:-1]), jnp.zeros(q.shape))
        m, s, o = jax.lax.fori_loop(0, blocks, body, init)
        return o / s[..., None]

    return _f(q, k, v)


def mlp(x, w_up, w_down, cfg: Config):
    @partial(jax.shard_map, mesh=cfg.mesh,
             in_specs=(P("dp", None, None), P(None, "tp"), P("tp", None)),
             out_specs=P("dp", None, None), check_vma=False)
    def _f(x, w_up, w_down):
        return jax.lax.psum(jax.nn.gelu(x @ w_up) @ w_down, "tp")

    return _f(x, w_up, w_down)


def paged_attention(q, k, v, cfg: Config):   # (another platform's kernel: never called here)
    @partial(jax.shard_map, mesh=cfg.mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
    def _f(q, k, v):
        return q

    return _f(q, k, v)


def layer(x, params, cfg: Config):
    b, t, d = x.shape
    heads = params["wq"].shape[1] // 4
    q, k, v = (jnp.einsum("btd,de->bte", x, params[n]).reshape(b, t, heads, 4)
               .transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    a = attention(q, k, v, cfg).transpose(0, 2, 1, 3).reshape(b, t, heads * 4)
    h = x + a @ params["wo"]
    return h + mlp(h, params["up"], params["down"], cfg)


def forward(params, x, cfg: Config):
    for p in params:
        x = layer(x, p, cfg)
    return x
'''

#: the user's script: a mesh, small random weights, and the function that runs the step once
DRIVER = '''from functools import partial

import jax
import numpy as np

from {model} import Config, forward

mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
cfg = Config(mesh)
rng = np.random.default_rng(0)
d = 16
params = [{{n: np.asarray(rng.normal(size=(d, d)) / 4, np.float32)
            for n in ("wq", "wk", "wv", "wo")}}
          | {{"up": np.asarray(rng.normal(size=(d, 32)) / 4, np.float32),
             "down": np.asarray(rng.normal(size=(32, d)) / 4, np.float32)}} for _ in range(2)]
x = np.asarray(rng.normal(size=(2, 8, d)), np.float32)


def main():
    return jax.jit(partial(forward, cfg=cfg))(params, x)


def loss(params, x):
    return jax.numpy.sum(jax.numpy.sin(forward(params, x, cfg)))
'''

#: a shard_map of the script's own that `main` never calls
UNCALLED = '''

def debug_sum(v):
    return jax.shard_map(lambda b: jax.lax.psum(b, "dp"), mesh=mesh,
                         in_specs=jax.sharding.PartitionSpec("dp"),
                         out_specs=jax.sharding.PartitionSpec(), check_vma=False)(v)
'''

_names = itertools.count()


def _project(tmp_path, model_text, driver_text):
    """The model module and the script in their own folder; `(script, model, module
    name)`."""
    return module_project(tmp_path, model_text, driver_text, prefix="model", script="driver.py")


def _load(script, name, monkeypatch):
    """The script of the project, importing its model module anew."""
    with monkeypatch.context() as m:
        m.syspath_prepend(str(script.parent))
        m.delitem(sys.modules, name, raising=False)
        spec = importlib.util.spec_from_file_location(f"driver_{name}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        m.delitem(sys.modules, name, raising=False)
    return module


def _line(text, fragment):
    return next(i for i, t in enumerate(text.splitlines(), 1) if fragment in t)


def _one_device(params, x):
    """The same decoder on the global arrays: attention as one softmax, the MLP unsharded."""
    for p in params:
        b, t, _d = x.shape
        heads = p["wq"].shape[1] // 4
        q, k, v = (jnp.einsum("btd,de->bte", x, p[n]).reshape(b, t, heads, 4)
                   .transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
        a = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q * 0.5, k), -1) @ v
        h = x + a.transpose(0, 2, 1, 3).reshape(b, t, heads * 4) @ p["wo"]
        x = h + jax.nn.gelu(h @ p["up"]) @ p["down"]
    return x


def _output_and_gradient(m):
    grads = jax.jit(jax.grad(m.loss, argnums=(0, 1)))(m.params, m.x)
    return np.asarray(m.main()), [np.asarray(g) for g in jax.tree.leaves(grads)]


def test_run_migrates_the_shard_maps_inside_a_models_functions(tmp_path, capsys, monkeypatch):
    """Two shard_maps decorate functions defined inside `attention` and `mlp`; `main()` reaches
    them through `jax.jit(forward)`. Both are turned on where they are written, the online
    softmax's three accumulators are cast where the loop starts them, the script is left as
    it is, and the migrated model computes the original's output and gradient, and one
    device's."""
    script, model, name = _project(tmp_path, MODEL, DRIVER + UNCALLED)
    original = _load(script, name, monkeypatch)
    out, grads = _output_and_gradient(original)
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    stdout, err = capsys.readouterr()
    assert f"migrated {model} to check_vma=True" in stdout
    # (the script's own shard_map, which `main` does not call, is left as well)
    assert script.read_text() == (DRIVER + UNCALLED).format(model=name)
    new = model.read_text()
    # (the kernel `main` does not reach stays as it is: nothing traced it)
    assert new.count("check_vma=True") == 2 and new.count("check_vma=False") == 1
    assert 'out_specs=P("dp"), check_vma=False)' in new
    assert len(new.splitlines()) == len(MODEL.splitlines())
    cast = _compat.vary_cast_source("jnp.zeros(q.shape)", ("dp", "tp"))
    assert cast in new and new.count("to='varying'" if "pcast" in cast else "pvary") == 3
    # each edit at the model's line
    init = _line(MODEL, "init = (")   # (the carry assigned just above the loop: cast there)
    for line in (_line(MODEL, "check_vma=False)"), _line(MODEL, "out_specs=P(\"dp\", None, None), "
                                                               "check_vma=False")):
        assert f"{model}:{line}: jax.shard_map(..., check_vma=False)" in err
    for i in range(3):
        assert f"{model}:{init}: fori_loop: the initial carry[{i}] is Invariant" in err
    assert "JAX still rejects" not in err and "what changes the numbers" not in err
    migrated = _load(script, name, monkeypatch)
    got, got_grads = _output_and_gradient(migrated)
    np.testing.assert_allclose(got, out, rtol=1e-6, atol=1e-6)
    for a, b in zip(got_grads, grads, strict=True):   # (float32 sums in another order)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    # one device: the forward and the gradient of sum(sin(out)) wrt the weights and the input
    want = jax.grad(lambda p, x: jnp.sum(jnp.sin(_one_device(p, x))), argnums=(0, 1))(
        migrated.params, migrated.x)
    np.testing.assert_allclose(got, np.asarray(_one_device(migrated.params, migrated.x)),
                               rtol=1e-5, atol=1e-5)
    for a, b in zip(got_grads, jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-4, atol=1e-4)
    # and nothing is left to migrate
    assert _port_cli.main(["--enable-vma", "--run", "main", str(script), str(model)]) == 0
    assert "nothing to migrate (no jax.shard_map(..., check_vma=False) call that main() makes)" \
        in capsys.readouterr().err


#: the loop's initial carry made by a helper function: JAX's error is about the loop, and no
#: edit at the loop reaches the value (`start` makes it)
UNREACHED = MODEL.replace(
    "        init = (jnp.full(q.shape[:-1], -jnp.inf), jnp.zeros(q.shape[:-1]), jnp.zeros(q.shape))\n",
    "        init = start(q)\n").replace(
    "def attention(q, k, v, cfg: Config):",
    "def start(q):\n"
    "    return (jnp.full(q.shape[:-1], -jnp.inf), jnp.zeros(q.shape[:-1]), jnp.zeros(q.shape))\n"
    "\n\ndef attention(q, k, v, cfg: Config):")


def test_run_reports_an_error_no_edit_fixes_at_the_models_line(tmp_path, capsys):
    script, model, _name = _project(tmp_path, UNREACHED, DRIVER)
    assert _port_cli.main(["--enable-vma", "--run", "main", str(script), str(model)]) == 1
    err = capsys.readouterr().err
    assert "JAX still rejects:" in err
    assert f"{model}:{_line(UNREACHED, 'jax.lax.fori_loop(')}: SPMD302" in err
    assert model.read_text() == UNREACHED


#: equinox: the shard_map inside a module's `__call__`, the step under `eqx.filter_jit` and
#: `eqx.filter_value_and_grad`; the sequence-parallel sum of the scores runs as a ring of
#: `ppermute`s whose accumulator starts as a constant
EQX_MODEL = '''from functools import partial

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


class RingMixer(eqx.Module):
    w: jax.Array
    mesh: jax.sharding.Mesh = eqx.field(static=True)

    def __call__(self, x):
        n = self.mesh.shape["sp"]

        @partial(jax.shard_map, mesh=self.mesh, in_specs=(P("sp", None), P()),
                 out_specs=P("sp", None), check_vma=False)
        def _f(x, w):
            h = jax.nn.tanh(x @ w)

            def hop(carry, _):
                acc, block = carry
                block = jax.lax.ppermute(block, "sp", [(i, (i + 1) % n) for i in range(n)])
                return (acc + block, block), None

            (acc, _), _ = jax.lax.scan(hop, (jnp.zeros(h.shape, h.dtype), h), None, length=n)
            return acc

        return _f(x, self.w)
'''

EQX_DRIVER = '''import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from {model} import RingMixer

mesh = jax.make_mesh((4,), ("sp",), axis_types=(jax.sharding.AxisType.Auto,))
rng = np.random.default_rng(1)
mixer = RingMixer(jnp.asarray(rng.normal(size=(8, 8)) / 3, jnp.float32), mesh)
x = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)


@eqx.filter_jit
def step(model, x):
    return eqx.filter_value_and_grad(lambda m: jnp.sum(jnp.sin(m(x))))(model)


def main():
    loss, grads = step(mixer, x)
    return loss, grads.w
'''


def _migrated_step(tmp_path, capsys, monkeypatch, model_text, driver_text):
    """Port a project whose `main()` returns a training step's `(loss, gradient)`: the
    report, the model's new text, the migrated script and its step, which equals the
    original's."""
    script, model, name = _project(tmp_path, model_text, driver_text)
    original = _load(script, name, monkeypatch)
    loss, grad = original.main()
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    migrated = _load(script, name, monkeypatch)
    step = migrated.main()
    np.testing.assert_allclose(float(step[0]), float(loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(step[1]), np.asarray(grad), rtol=1e-5, atol=1e-6)
    return err, model, migrated, step


def _step_equals_one_device(step, one_device, w, x):
    """The step's loss and gradient (w.r.t. `w`) are `one_device(w, x)`'s."""
    np.testing.assert_allclose(float(step[0]), float(one_device(w, x)), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(step[1]), np.asarray(jax.grad(one_device)(w, x)),
                               rtol=1e-4, atol=1e-5)


def test_run_migrates_an_equinox_modules_shard_map_under_filter_value_and_grad(
        tmp_path, capsys, monkeypatch):
    """The ring's accumulator starts as `jnp.zeros(h.shape, h.dtype)`; the block it adds varies:
    the scan's initial carry is cast in the module's `__call__`; the migrated step's loss and
    gradient equal the original's and one device's (every row gets the sum of all four
    blocks)."""
    err, model, migrated, step = _migrated_step(tmp_path, capsys, monkeypatch, EQX_MODEL,
                                                EQX_DRIVER)
    assert _compat.vary_cast_source("jnp.zeros(h.shape, h.dtype)", ("sp",)) in model.read_text()
    assert f"{model}:{_line(EQX_MODEL, 'jax.lax.scan(')}: scan: the initial carry[0]" in err

    def one_device(w, x):
        h = jnp.tanh(x @ w).reshape(4, 4, 8).sum(0)
        return jnp.sum(jnp.sin(jnp.tile(h, (4, 1))))

    _step_equals_one_device(step, one_device, migrated.mixer.w, migrated.x)


@pytest.mark.parametrize("argv, message", [
    (["--run", "main"], "--run goes with --enable-vma"),
    (["--enable-vma", "--run", "nope"], "has no function nope (--run)"),
])
def test_run_usage_errors(tmp_path, capsys, argv, message):
    script, model, _name = _project(tmp_path, MODEL, DRIVER)
    assert _port_cli.main([*argv, str(script), str(model)]) == 2
    assert message in capsys.readouterr().err
    assert model.read_text() == MODEL


def test_run_reports_a_function_that_fails_before_any_change(tmp_path, capsys):
    script, model, _name = _project(tmp_path, MODEL, DRIVER + "\n\ndef broken():\n"
                                    "    raise RuntimeError('no data here')\n")
    assert _port_cli.main(["--enable-vma", "--run", "broken", str(script), str(model)]) == 2
    assert "broken() fails before any change: RuntimeError: no data here" in \
        capsys.readouterr().err


@pytest.mark.parametrize("init", [True, False], ids=["package", "namespace-package"])
def test_run_migrates_a_packages_module(tmp_path, capsys, monkeypatch, init):
    """The model in a package, as jax-llm-examples lays one out (`qwen3_jax/model.py`,
    imported `from qwen3_jax import model`, with no `__init__.py` there: a namespace
    package), a helper imported relatively (`from . import ops`): the candidates are written
    inside a copy of the package, so the script's import and the relative one find them, and
    the file written is the package's; the migrated model computes one device's numbers."""
    name = f"lm_{next(_names)}"
    folder = tmp_path / "project"
    package = folder / name
    package.mkdir(parents=True)
    if init:
        (package / "__init__.py").write_text("")
    ops = "import jax.numpy as jnp\n\n\ndef zeros(shape):\n    return jnp.zeros(shape)\n"
    (package / "ops.py").write_text(ops)
    text = MODEL.replace("import jax.numpy as jnp\n",
                         "import jax.numpy as jnp\n\nfrom . import ops\n")
    text = text.replace("jnp.zeros(q.shape))", "ops.zeros(q.shape))")
    model = package / "model.py"
    model.write_text(text)
    script = folder / "driver.py"
    script.write_text(DRIVER.format(model=f"{name}.model"))
    monkeypatch.syspath_prepend(str(folder))
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    for i in range(3):
        assert f"{model}:{_line(text, 'init = (')}: fori_loop: the initial carry[{i}]" in err
    new = model.read_text()
    assert new.count("check_vma=True") == 2 and new.count("check_vma=False") == 1
    assert _compat.vary_cast_source("ops.zeros(q.shape)", ("dp", "tp")) in new
    assert (package / "ops.py").read_text() == ops
    assert sorted(p.name for p in package.iterdir() if p.suffix == ".py") == \
        sorted(["ops.py", "model.py", *(["__init__.py"] if init else [])])
    assert script.read_text() == DRIVER.format(model=f"{name}.model")
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        monkeypatch.delitem(sys.modules, mod)
    migrated = _load(script, f"{name}.model", monkeypatch)
    np.testing.assert_allclose(np.asarray(migrated.main()),
                               np.asarray(_one_device(migrated.params, migrated.x)),
                               rtol=1e-5, atol=1e-5)


#: weights in a pytree class of the model's own (jax-llm-examples' `QuantArray`: values and
#: their scales), whose specs are given as an instance of the class (an in_specs prefix)
QUANT = MODEL.replace('''def mlp(x, w_up, w_down, cfg: Config):
    @partial(jax.shard_map, mesh=cfg.mesh,
             in_specs=(P("dp", None, None), P(None, "tp"), P("tp", None)),
             out_specs=P("dp", None, None), check_vma=False)
    def _f(x, w_up, w_down):
        return jax.lax.psum(jax.nn.gelu(x @ w_up) @ w_down, "tp")
''', '''@partial(jax.tree_util.register_dataclass, data_fields=["quant", "scale"], meta_fields=[])
@dataclasses.dataclass
class QuantArray:
    quant: jax.Array
    scale: jax.Array


def mlp(x, w_up, w_down, cfg: Config):
    w_up = QuantArray(w_up, jnp.ones(w_up.shape[-1:]))
    up_spec = QuantArray(P(None, "tp"), P("tp"))

    @partial(jax.shard_map, mesh=cfg.mesh, in_specs=(P("dp", None, None), up_spec, P("tp", None)),
             out_specs=P("dp", None, None), check_vma=False)
    def _f(x, w_up, w_down):
        return jax.lax.psum(jax.nn.gelu(x @ w_up.quant * w_up.scale) @ w_down, "tp")
''')


def test_run_compares_the_numbers_of_a_body_taking_the_models_pytree_class(
        tmp_path, capsys, monkeypatch):
    """The migrated module's `QuantArray` is another class than the original's: each program
    gets the same random values built from its own arguments, and the numbers are compared
    (before: "not compared", JAX's pytree structure error between the two classes)."""
    assert QUANT != MODEL
    script, model, name = _project(tmp_path, QUANT, DRIVER)
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    assert "not compared" not in err and "notes" not in err
    assert f"{model}:{_line(QUANT, 'None), check_vma=False)')}: jax.shard_map(" in err
    migrated = _load(script, name, monkeypatch)
    np.testing.assert_allclose(np.asarray(migrated.main()),
                               np.asarray(_one_device(migrated.params, migrated.x)),
                               rtol=1e-5, atol=1e-5)


#: a shard_map whose body takes another path for a decode step (one token), as a model's
#: attention does: only that path calls a `custom_vjp` whose backward loop starts Invariant
#: (`test_migrate_vma.CUSTOM_VJP`)
DECODE = "from functools import partial\n\n" + CUSTOM_VJP.replace(
    "from jax import lax\n", "from jax import lax\nfrom jax.sharding import PartitionSpec as P\n"
) + '''

def block(x, mesh):
    @partial(jax.shard_map, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
    def _f(x):
        if x.shape[1] == 1:   # a decode step
            return scaled(x)
        return x * 3.0

    return _f(x)
'''

DECODE_DRIVER = '''from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from {model} import block

mesh = jax.make_mesh((4,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
x = np.asarray(np.random.default_rng(2).normal(size=(8, 4)), np.float32)


def main():
    step = jax.jit(partial(block, mesh=mesh))
    return step(x), step(x[:, :1])


def grad(x):
    return jax.grad(lambda x: jnp.sum(jnp.sin(block(x, mesh))))(x)
'''


def test_run_traces_each_shape_a_call_is_made_with(tmp_path, capsys, monkeypatch):
    """`main` calls the step on a prompt and on one token; the body's decode path is the
    only one with a `custom_vjp`, whose backward loop JAX rejects with the checks on. The
    call is traced once per shapes it was made with (its gradient too), so the backward loop
    is migrated though `main` takes no gradient; the migrated decode step's gradient equals
    one device's."""
    script, model, name = _project(tmp_path, DECODE, DECODE_DRIVER)
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    new = model.read_text()
    assert _compat.vary_cast_source("jnp.zeros(g.shape)", ("dp",)) in new
    assert f"{model}:{_line(DECODE, 'lax.fori_loop(')}: fori_loop: the initial carry" in err
    migrated = _load(script, name, monkeypatch)
    token = jnp.asarray(migrated.x[:, :1])
    np.testing.assert_allclose(np.asarray(migrated.grad(token)), 3 * np.cos(3 * np.asarray(token)),
                               rtol=1e-5, atol=1e-6)


#: a Pallas kernel (interpret mode, on CPU) in a shard_map manual over `tp` only (`axis_names`),
#: on a mesh whose `dp` axis stays Explicit
PARTIAL_PALLAS = '''from functools import partial

import jax
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def block(x, mesh):
    @partial(jax.shard_map, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"),
             axis_names={"tp"}, check_vma=False)
    def _f(x):
        return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                              interpret=True)(x)

    return _f(x)
'''

PARTIAL_PALLAS_DRIVER = '''from functools import partial

import jax
import jax.numpy as jnp

from {model} import block

mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
x = jax.device_put(jnp.ones((8, 16)),
                   jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "tp")))


def main():   # (traced, not run: interpret mode cannot run a kernel under check_vma=True)
    return jax.make_jaxpr(partial(block, mesh=mesh))(x)
'''


def test_run_gives_a_pallas_kernels_outputs_the_shard_maps_manual_axes(tmp_path, capsys,
                                                                         monkeypatch):
    """A shard_map manual over `tp` only: the kernel's outputs vary over `tp`, not over the
    mesh's `dp` too, which JAX refuses ("Axes mentioned in `manual_axis_type` ... should be
    of type `Manual`"): the migrated kernel is accepted with the checks on."""
    script, model, name = _project(tmp_path, PARTIAL_PALLAS, PARTIAL_PALLAS_DRIVER)
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    assert "JAX still rejects" not in err
    new = model.read_text()
    assert "manual_axis_type=jax.sharding.ManualAxisType(varying={'tp'})" in new
    migrated = _load(script, name, monkeypatch)
    assert "pallas_call" in str(migrated.main())


def test_a_kernel_run_at_import_gets_the_shard_maps_manual_axes_too(tmp_path, capsys):
    """The same kernel in a module that runs its shard_map at import (no `--run`): JAX's error
    is raised by the import, outside any traced body, and the manual axes are the module's
    shard_map's. (Running it then fails in JAX's interpreter, which cannot run a kernel under
    `check_vma=True`; on a TPU it runs.)"""
    path = tmp_path / f"kernel_{next(_names)}.py"
    driver = PARTIAL_PALLAS_DRIVER.split("from {model} import block")[1]
    path.write_text(PARTIAL_PALLAS.replace("import jax\n", "import jax\nimport jax.numpy as jnp\n")
                    + driver.replace("def main():", "y = jax.jit(partial(block, mesh=mesh))(x)"
                                     "\n\n\ndef main():"))
    assert _port_cli.main(["--enable-vma", "--write", str(path)]) in (0, 1)
    assert "manual_axis_type=jax.sharding.ManualAxisType(varying={'tp'})" in path.read_text()
    assert "should be of type `Manual`" not in capsys.readouterr().err


#: jax-llm-examples' serving layout (`attention_cache_utils.py`): a shard_map with neither
#: `mesh=` nor `in_specs=` (the mesh `jax.set_mesh` makes current, the specs read off the
#: arguments' shardings), inside a function the step jits
CACHE = '''import jax
import jax.numpy as jnp
from jax import lax


def update(cache, x):
    def update_fn(cache, x):
        def body(i, acc):
            return acc + x * i
        return cache + lax.fori_loop(0, 3, body, jnp.zeros(x.shape))

    return jax.shard_map(update_fn, out_specs=jax.typeof(cache).sharding.spec,
                         check_vma=False)(cache, x)
'''

CACHE_DRIVER = '''import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from {model} import update

mesh = jax.make_mesh((4,), ("dp",), axis_types=(jax.sharding.AxisType.Explicit,))
cache = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("dp")))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("dp")))


def main():
    with jax.sharding.set_mesh(mesh):
        return jax.jit(update)(cache, x)
'''


def test_run_migrates_a_call_without_mesh_or_in_specs_under_jit(tmp_path, capsys, monkeypatch):
    """Inside `jax.jit` only the abstract mesh is current: the migration traces and runs the
    body on a mesh of the same axes made of this process's devices, with the specs read off
    the arguments (before: "Expected mesh of type `jax.sharding.Mesh`. Got AbstractMesh",
    exit 2). The migrated update computes one device's `cache + 3 x`."""
    script, model, name = _project(tmp_path, CACHE, CACHE_DRIVER)
    assert _port_cli.main(["--enable-vma", "--run", "main", "--write", str(script),
                           str(model)]) == 0
    err = capsys.readouterr().err
    assert f"{model}:{_line(CACHE, 'lax.fori_loop(')}: fori_loop: the initial carry" in err
    assert "notes" not in err   # (the numbers were compared)
    migrated = _load(script, name, monkeypatch)
    np.testing.assert_allclose(np.asarray(migrated.main()),
                               1 + 3 * np.arange(32.0).reshape(8, 4))


#: flax nnx: the shard_map inside a module's `__call__` (weights read from `nnx.Param`s), a
#: `jax.tree.map` lambda over the carry in the body, the step under `nnx.value_and_grad`
NNX_MODEL = '''from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P


class Mixer(nnx.Module):
    def __init__(self, mesh, rngs):
        self.mesh = mesh
        self.w = nnx.Param(jax.random.normal(rngs.params(), (8, 8)) / 3)

    def __call__(self, x):
        @partial(jax.shard_map, mesh=self.mesh, in_specs=(P("dp", None), P()),
                 out_specs=P("dp", None), check_vma=False)
        def _f(x, w):
            def step(carry, _):
                h, total = carry
                h = jax.nn.tanh(h @ w)
                return jax.tree.map(lambda a, b: a + b, (h, total), (0.0 * h, h)), None

            (_, total), _ = jax.lax.scan(step, (x, jnp.zeros(x.shape)), None, length=3)
            return total

        return _f(x, self.w[...])
'''

NNX_DRIVER = '''import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from {model} import Mixer

mesh = jax.make_mesh((4,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))
model = Mixer(mesh, nnx.Rngs(0))
x = jnp.asarray(np.random.default_rng(3).normal(size=(16, 8)), jnp.float32)


@nnx.jit
def train_step(model, x):
    return nnx.value_and_grad(lambda m: jnp.sum(jnp.sin(m(x))))(model)


def main():
    loss, grads = train_step(model, x)
    return loss, grads.w[...]
'''


def test_run_migrates_a_flax_nnx_modules_shard_map_under_value_and_grad(tmp_path, capsys,
                                                                        monkeypatch):
    """The scan's running total starts as `jnp.zeros(x.shape)` while the body adds Varying
    values (through a `jax.tree.map` lambda): cast in the module's `__call__`; the migrated
    step's loss and gradient equal the original's and one device's (three tanh layers,
    summed)."""
    err, model, migrated, step = _migrated_step(tmp_path, capsys, monkeypatch, NNX_MODEL,
                                                NNX_DRIVER)
    assert _compat.vary_cast_source("jnp.zeros(x.shape)", ("dp",)) in model.read_text()
    assert f"{model}:{_line(NNX_MODEL, 'jax.lax.scan(')}: scan: the initial carry[1]" in err

    def one_device(w, x):
        total, h = 0.0, x
        for _ in range(3):
            h = jnp.tanh(h @ w)
            total = total + h
        return jnp.sum(jnp.sin(total))

    _step_equals_one_device(step, one_device, migrated.model.w[...], migrated.x)

"""`port --enable-vma FILE` and `infer --vma-changes FILE`: code written for
`jax.shard_map(..., check_vma=False)` migrated to the checks on. For each program: after
`port --enable-vma --write` the module imports, JAX accepts it with `check_vma=True`, and its
numbers equal the original's; the gradient psum that the checks double is reported with its
line and fix; an error no edit fixes is reported with its line."""

from __future__ import annotations

import importlib.util
import itertools
import pathlib
import re
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import module_project

from spmdtyped import _compat
from spmdtyped._cli import infer as _infer_cli
from spmdtyped._cli import port as _port_cli
from spmdtyped.adapters._port import vma

HEAD = '''import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

'''

#: (a) a fori_loop whose carry starts Invariant and leaves the body Varying
LOOP = HEAD + '''mesh = jax.make_mesh((4,), ("dp",))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32, NamedSharding(mesh, P("dp")))


@jax.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
def power_sum(x):
    def body(i, acc):
        return acc + x * i

    return jax.lax.fori_loop(0, 4, body, jnp.zeros(x.shape))


def run(m):
    return m.power_sum(m.x)


if __name__ == "__main__":
    print(power_sum(x))
'''

#: (b) cond / switch branches in different states (a lambda and a named branch)
BRANCHES = HEAD + '''from functools import partial

from jax import lax

mesh = jax.make_mesh((4,), ("dp",))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32 - 0.3, NamedSharding(mesh, P("dp")))


def zeros(v):
    return jnp.zeros((2, 4))


@partial(jax.shard_map, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
def gate(x):
    total = lax.psum(jnp.sum(x), "dp")
    y = lax.cond(total > 0, lambda v: v * 2.0, lambda v: jnp.zeros((2, 4)), x)
    return y + lax.switch(1, [lambda v: v + 1.0, zeros], x)


def run(m):
    return m.gate(m.x)


if __name__ == "__main__":
    print(gate(x))
'''

#: (c) a data-parallel step: the explicit psum of a replicated parameter's gradient and
#: psum(1, "dp") for the axis size
DP_STEP = HEAD + '''mesh = jax.make_mesh((4,), ("dp",))
w = jax.device_put(jnp.ones((4, 2)) / 4, NamedSharding(mesh, P()))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32, NamedSharding(mesh, P("dp")))


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def step(w, x):
    g = jax.grad(loss)(w, x)
    g = jax.lax.psum(g, "dp")
    n = jax.lax.psum(1, "dp")
    return w - 0.1 * g / n


train_step = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P(),
                           check_vma=False)


def run(m):
    return m.train_step(m.w, m.x)


if __name__ == "__main__":
    print(train_step(w, x))
'''

#: (d) ring attention: a scan whose carry holds Invariant accumulators and ppermuted k / v
RING = HEAD + '''mesh = jax.make_mesh((4,), ("sp",))
spec = NamedSharding(mesh, P("sp"))
q = jax.device_put(jnp.sin(jnp.arange(128.0)).reshape(16, 8), spec)
k = jax.device_put(jnp.cos(jnp.arange(128.0)).reshape(16, 8), spec)
v = jax.device_put(jnp.arange(128.0).reshape(16, 8) / 128, spec)
PERM = [(i, (i + 1) % 4) for i in range(4)]


def ring_attention(q, k, v):
    def step(carry, _):
        o, m, l, k, v = carry
        s = q @ k.T
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[:, None])
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(axis=-1)
        o = o * corr[:, None] + p @ v
        k = jax.lax.ppermute(k, "sp", PERM)
        v = jax.lax.ppermute(v, "sp", PERM)
        return (o, m_new, l, k, v), None

    init = (jnp.zeros(q.shape), jnp.full(q.shape[:1], -jnp.inf), jnp.zeros(q.shape[:1]), k, v)
    (o, m, l, _, _), _ = jax.lax.scan(step, init, None, length=4)
    return o / l[:, None]


attention = jax.shard_map(ring_attention, mesh=mesh, in_specs=(P("sp"), P("sp"), P("sp")),
                          out_specs=P("sp"), check_vma=False)


def run(m):
    return m.attention(m.q, m.k, m.v)


if __name__ == "__main__":
    print(attention(q, k, v))
'''

#: pytree outputs and carries on a (dp, tp) mesh: one component of a cond output, of a
#: fori_loop carry (two components, over different axes) and of a while_loop carry
PYTREES = HEAD + '''from jax import lax

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
x = jax.device_put(jnp.arange(64.0).reshape(8, 8) / 64, NamedSharding(mesh, P("dp", "tp")))


@jax.shard_map(mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp"), check_vma=False)
def many(x):
    a, b = lax.cond(x.sum() > 0, lambda: (x, jnp.zeros((4, 2))), lambda: (x * 2, x))
    c = lax.fori_loop(0, 3, lambda i, c: (c[0] + a, c[1] + lax.psum(b, "tp")),
                      (jnp.zeros((4, 2)), jnp.ones((4, 2))))
    d = lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, c[1] + x),
                       (0, jnp.zeros((4, 2))))[1]
    return a + b + c[0] + c[1] + d


def run(m):
    return m.many(m.x)


if __name__ == "__main__":
    print(many(x))
'''

#: the data-parallel step with a pmean of the gradient (the mean becomes the sum)
DP_MEAN = DP_STEP.replace('g = jax.lax.psum(g, "dp")', 'g = jax.lax.pmean(g, "dp")').replace(
    "g / n", "g")

#: a while_loop carry that no source edit reaches: the initial carry is a call's result
UNFIXABLE = HEAD + '''mesh = jax.make_mesh((4,), ("dp",))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32, NamedSharding(mesh, P("dp")))


def start(x):
    return (0, jnp.zeros(x.shape))


@jax.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
def accumulate(x):
    return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + x), start(x))[1]


def run(m):
    return m.accumulate(m.x)


if __name__ == "__main__":
    print(accumulate(x))
'''

_names = itertools.count()


def _line(text, fragment):
    """The line of `fragment` in the program `text` (as written to its file)."""
    lines = textwrap.dedent(text).splitlines()
    return next(i for i, t in enumerate(lines, 1) if fragment in t)


def _write(tmp_path, text):
    path = tmp_path / f"vma_prog_{next(_names)}.py"
    path.write_text(textwrap.dedent(text))
    return path


def _load(path):
    spec = importlib.util.spec_from_file_location(f"loaded_{next(_names)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _migrated(tmp_path, text, capsys, status=0):
    """Port the program, load the original and the migrated module; `(original, migrated,
    new text, stderr)`."""
    path = _write(tmp_path, text)
    original = _load(_write(tmp_path, text))
    assert _port_cli.main(["--enable-vma", "--write", str(path)]) == status
    err = capsys.readouterr().err
    new = path.read_text()
    assert "check_vma=False" not in new and "check_vma=True" in new
    return original, _load(path), new, err, path


@pytest.mark.parametrize("text,edits", [
    (LOOP, ["jax.lax.fori_loop(0, 4, body, " + _compat.vary_cast_source(
        "jnp.zeros(x.shape)", ("dp",)) + ")"]),
    (BRANCHES, ["lambda v: " + _compat.vary_cast_source("jnp.zeros((2, 4))", ("dp",)),
                "lambda *a: " + _compat.vary_cast_source("zeros(*a)", ("dp",))]),
    (RING, [_compat.vary_cast_source("jnp.zeros(q.shape)", ("sp",)),
            _compat.vary_cast_source("jnp.full(q.shape[:1], -jnp.inf)", ("sp",)),
            _compat.vary_cast_source("jnp.zeros(q.shape[:1])", ("sp",)) + ", k, v)"]),
    (PYTREES, ["lambda: (x, " + _compat.vary_cast_source("jnp.zeros((4, 2))", ("dp", "tp")) + ")",
               "(" + _compat.vary_cast_source("jnp.zeros((4, 2))", ("dp", "tp")) + ", "
               + _compat.vary_cast_source("jnp.ones((4, 2))", ("dp",)) + ")",
               "(0, " + _compat.vary_cast_source("jnp.zeros((4, 2))", ("dp", "tp")) + ")"]),
], ids=["fori_loop", "cond_switch", "ring_attention", "pytrees"])
def test_migrated_program_is_accepted_and_computes_the_same(tmp_path, capsys, text, edits):
    original, migrated, new, err, path = _migrated(tmp_path, text, capsys)
    for edit in edits:
        assert edit in new
    # the edits never add a line: the module's line numbers stay the original's
    assert len(new.splitlines()) == len(textwrap.dedent(text).splitlines())
    # the migrated module runs with check_vma=True (JAX accepts it) and computes the same
    np.testing.assert_allclose(np.asarray(migrated.run(migrated)),
                               np.asarray(original.run(original)), rtol=1e-6, atol=1e-6)
    assert "edits (turning the checks on):" in err
    assert f"{path}:" in err and "what changes the numbers" not in err
    # a second run finds nothing left to migrate
    assert _port_cli.main(["--enable-vma", str(path)]) == 0
    assert "nothing to migrate" in capsys.readouterr().err


def test_fori_loop_report_names_the_loop_line(tmp_path, capsys):
    path = _write(tmp_path, LOOP)
    assert _port_cli.main(["--enable-vma", str(path)]) == 0   # the diff only
    out, err = capsys.readouterr()
    assert path.read_text() == textwrap.dedent(LOOP)
    assert out.startswith("--- a/") and "+    return jax.lax.fori_loop(0, 4, body, " in out
    assert f"{path}:{_line(LOOP, 'check_vma=False')}: jax.shard_map(..., check_vma=False)" in err
    assert f"{path}:{_line(LOOP, 'fori_loop(')}: fori_loop: the initial carry is Invariant and the body makes it " \
           f"Varying over dp; fix: " in err
    # --check: exit 1 when the file would change
    assert _port_cli.main(["--enable-vma", "--check", str(path)]) == 1


def test_gradient_psum_of_a_replicated_parameter_is_reported(tmp_path, capsys):
    """(c): with the checks on JAX's transpose already sums the gradient of `w`
    (replicated over dp): the explicit psum multiplies it by 4; the report names line 17 and
    the fix, and the outputs of the two programs differ."""
    original, migrated, new, err, path = _migrated(tmp_path, DP_STEP, capsys, status=1)
    assert "what changes the numbers:" in err
    psum_line, size_line = _line(DP_STEP, "psum(g,"), _line(DP_STEP, "psum(1,")
    assert f"{path}:{psum_line}: SPMD103: psum of a value that is already Invariant" in err
    assert "fix: drop the psum: the gradient is already summed over the axis" in err
    assert f"{path}:{size_line}: psum(1, axis) for the axis size" in err
    assert f"{path}:{size_line}: SPMD103" not in err   # (the same number: a note only)
    assert 'fix: jax.lax.axis_size("dp")' in err
    assert f"{path}:{_line(DP_STEP, 'train_step = ')}: jax.shard_map(step): with check_vma=True the outputs differ" in err
    want, got = np.asarray(original.run(original)), np.asarray(migrated.run(migrated))
    assert not np.allclose(want, got)
    # the fix the report names gives the original's numbers back
    fixed = _write(tmp_path, new.replace('    g = jax.lax.psum(g, "dp")\n', "    g = g\n"))
    np.testing.assert_allclose(np.asarray(_load(fixed).run(_load(fixed))), want, rtol=1e-6)


def test_gradient_pmean_of_a_replicated_parameter_is_reported(tmp_path, capsys):
    """With the checks on, the pmean of a gradient JAX already summed gives the sum: the fix
    the report names (divide by the axis size) gives the original's numbers back."""
    original, migrated, new, err, path = _migrated(tmp_path, DP_MEAN, capsys, status=1)
    line = _line(DP_MEAN, "pmean(g,")
    assert f"{path}:{line}: SPMD103: pmean of a value that is already Invariant" in err
    assert "fix: divide by the axis size instead: g / jax.lax.axis_size(axis)" in err
    want = np.asarray(original.run(original))
    assert not np.allclose(np.asarray(migrated.run(migrated)), want)
    fixed = _write(tmp_path, new.replace('jax.lax.pmean(g, "dp")', 'g / jax.lax.axis_size("dp")'))
    np.testing.assert_allclose(np.asarray(_load(fixed).run(_load(fixed))), want, rtol=1e-6)


def test_vma_changes_reports_without_rewriting(tmp_path, capsys):
    path = _write(tmp_path, DP_STEP)
    assert _infer_cli.main([str(path), "--vma-changes"]) == 1
    out = capsys.readouterr().out
    assert path.read_text() == textwrap.dedent(DP_STEP)
    assert f"{path}:{_line(DP_STEP, 'psum(g,')}: SPMD103" in out
    assert f"{path}:{_line(DP_STEP, 'psum(1,')}: psum(1, axis)" in out
    assert f"{path}:{_line(DP_STEP, 'check_vma=False')}: jax.shard_map(..., check_vma=False)" in out
    assert "port --enable-vma --write" in out

    loop = _write(tmp_path, RING)
    assert _infer_cli.main([str(loop), "--vma-changes"]) == 1
    out = capsys.readouterr().out
    assert out.count(f"{loop}:{_line(RING, 'init = ')}: scan: the initial carry[") == 3
    assert loop.read_text() == textwrap.dedent(RING)


def test_docs_show_the_report(tmp_path, capsys):
    """docs/porting.md ("Turning JAX's checks on") shows the report of DP_STEP, as train.py."""
    path = _write(tmp_path, DP_STEP)
    assert _infer_cli.main([str(path), "--vma-changes"]) == 1
    report = capsys.readouterr().out.replace(str(path), "train.py")
    report = report.split("(python -m spmdtyped port", 1)[0].strip()
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "porting.md").read_text()
    shown = doc.split("### Turning JAX's checks on", 1)[1].split("```text\n", 1)[1]
    shown = shown.split("```", 1)[0].strip()

    def same(t):
        return re.sub(r"max \|diff\| [0-9.e+-]+", "max |diff| N", t)

    assert same(shown) == same(report)


def test_flags_fill_in_what_the_module_does_not_say(tmp_path, capsys):
    """A shard_map made in a function the import does not run: `--mesh` and `--shapes`."""
    text = LOOP.split("@jax.shard_map")[0] + '''def power_sum(x):
    def body(i, acc):
        return acc + x * i

    return jax.lax.fori_loop(0, 4, body, jnp.zeros(x.shape))


def build(mesh):
    return jax.shard_map(power_sum, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"),
                         check_vma=False)
'''
    path = _write(tmp_path, text)
    assert _infer_cli.main([str(path), "--vma-changes"]) == 2
    assert "cannot tell its mesh, shapes: pass --mesh --shapes" in capsys.readouterr().err
    args = ["--mesh", "dp=4", "--shapes", "f32[8,4]"]
    assert _port_cli.main(["--enable-vma", "--write", str(path), *args]) == 0
    err = capsys.readouterr().err
    assert f"{path}:{_line(text, 'fori_loop(')}: fori_loop: the initial carry is Invariant" in err
    migrated, original = _load(path), _load(_write(tmp_path, text))
    np.testing.assert_allclose(np.asarray(migrated.build(migrated.mesh)(migrated.x)),
                               np.asarray(original.build(original.mesh)(original.x)))


def test_a_module_that_runs_its_shard_map_at_import(tmp_path, capsys):
    """The candidate's import raises JAX's error (the call at module level): fixed the same."""
    text = LOOP.replace("def run(m):", "OUT = power_sum(x)\n\n\ndef run(m):")
    original, migrated, new, err, path = _migrated(tmp_path, text, capsys)
    assert f"{path}:{_line(text, 'fori_loop(')}: fori_loop: the initial carry" in err
    np.testing.assert_allclose(np.asarray(migrated.OUT), np.asarray(original.OUT))


def test_nothing_to_migrate(tmp_path, capsys):
    path = _write(tmp_path, LOOP.replace("check_vma=False", "check_vma=True").replace(
        "jnp.zeros(x.shape)", "jnp.zeros_like(x)"))
    assert _infer_cli.main([str(path), "--vma-changes"]) == 0
    assert "nothing changes with check_vma=True" in capsys.readouterr().out
    assert _port_cli.main(["--enable-vma", str(path)]) == 0
    assert "nothing to migrate" in capsys.readouterr().err


def test_an_error_no_edit_fixes_is_reported_with_its_line(tmp_path, capsys):
    path = _write(tmp_path, UNFIXABLE)
    assert _port_cli.main(["--enable-vma", str(path)]) == 1
    err = capsys.readouterr().err
    assert "JAX still rejects:" in err
    line = _line(UNFIXABLE, "while_loop(")
    assert f"{path}:{line}: SPMD302: JAX rejects it with check_vma=True: while_loop body" in err
    assert "fix: give the value the state JAX asks for where it is made" in err


def test_parse_error_reads_jax_messages():
    """The carry and branch messages of the installed JAX give the component and the axes."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    P = jax.sharding.PartitionSpec
    sds = jax.ShapeDtypeStruct((8, 8), np.float32, sharding=jax.NamedSharding(mesh, P("dp", "tp")))

    def scan_body(x):
        def step(c, _):
            return (c[0] + x, c[1]), None
        return jax.lax.scan(step, (np.zeros((4, 2), np.float32), x), None, length=2)[0][0]

    def cond_body(x):
        return jax.lax.cond(True, lambda: np.zeros((4, 2), np.float32), lambda: x)

    for body, want in [(scan_body, vma.Fix("carry", ("scan", "fori_loop"), None, ("dp", "tp"),
                                           path=(0,))),
                       (cond_body, vma.Fix("branch", ("cond",), None, ("dp", "tp"),
                                           branch="true_fun"))]:
        f = jax.shard_map(body, mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp"))
        with pytest.raises(Exception) as e:
            jax.make_jaxpr(f)(sds)
        fixes = vma.parse_error(e.value, __file__, ("dp", "tp"))
        assert [(f.kind, f.calls, f.axes, f.path, f.branch) for f in fixes] == \
            [(want.kind, want.calls, want.axes, want.path, want.branch)]
        assert fixes[0].line is not None


# ------------------------------------------------------------------- helper modules

#: a kernel library next to the training script (the layout of haoliuhl/ringattention: the
#: kernels in one module, the shard_map in the user's): a ring sum whose scan starts its
#: accumulator Invariant, and a gate whose second output is Invariant in one branch
KERNELS = '''import jax
import jax.numpy as jnp
from jax import lax


def ring_sum(x, axis_name):
    n = lax.axis_size(axis_name)
    perm = [(i, (i + 1) % n) for i in range(n)]

    def step(carry, _):
        acc, block = carry
        return (acc + block, lax.ppermute(block, axis_name, perm)), None

    (acc, _), _ = lax.scan(step, (jnp.zeros(x.shape), x), None, length=n)
    return acc


def gate(x):
    return lax.cond(x.sum() > 0, lambda v: (v * 2.0, v + 1.0), lambda v: (v, jnp.ones(v.shape)), x)
'''

#: the training script: its shard_map body calls the kernels (`{kernels}`: the module's name)
USES_KERNELS = HEAD + '''import {kernels} as kernels

mesh = jax.make_mesh((4,), ("sp",))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32, NamedSharding(mesh, P("sp")))


def body(x):
    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b


fused = jax.shard_map(body, mesh=mesh, in_specs=P("sp"), out_specs=P("sp"), check_vma=False)


def run(m):
    return m.fused(m.x)


if __name__ == "__main__":
    print(fused(x))
'''

#: a blockwise-attention skip: the branch that skips a block returns the loop's carry as it
#: came in (`lambda c: (c, None)`): the components JAX names are inside that name, and the
#: Invariant value is the scan's initial carry
SKIP = '''import jax
import jax.numpy as jnp
from jax import lax


def blocks(x):
    def body(carry, i):
        return lax.cond(i % 2 == 0, lambda c: ((c[0] + x, c[1] + x), None), lambda c: (c, None),
                        carry)

    (a, b), _ = lax.scan(body, (jnp.zeros(x.shape), jnp.zeros(x.shape)), jnp.arange(4))
    return a + b
'''

USES_SKIP = USES_KERNELS.replace('''    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b''', '''    return kernels.blocks(x)''')

#: ring attention's shape (haoliuhl/ringattention): a ring `scan` whose accumulators start
#: Invariant, and inside it a blockwise `scan` over the accumulators with a skipping branch.
#: JAX names the inner loop first; once the ring's carry is cast, the inner cast is of a
#: Varying value, which JAX refuses: it is taken back
NESTED = '''import jax
import jax.numpy as jnp
from jax import lax


def ring_blocks(x, axis_name):
    n = lax.axis_size(axis_name)
    perm = [(i, (i + 1) % n) for i in range(n)]

    def ring(carry, _):
        acc, block = carry

        def blockwise(c, i):
            return lax.cond(i % 2 == 0, lambda c: ((c[0] + block * i,), None), lambda c: (c, None), c)

        (acc,), _ = lax.scan(blockwise, (acc,), jnp.arange(4))
        return (acc, lax.ppermute(block, axis_name, perm)), None

    (acc, _), _ = lax.scan(ring, (jnp.zeros(x.shape), x), None, length=n)
    return acc
'''

USES_NESTED = USES_KERNELS.replace('''    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b''', '''    return kernels.ring_blocks(x, "sp")''')

#: a `custom_vjp` whose backward pass accumulates the cotangent in a `fori_loop` that starts
#: Invariant: only the gradient's trace meets it
CUSTOM_VJP = '''import jax
import jax.numpy as jnp
from jax import lax


@jax.custom_vjp
def scaled(x):
    return x * 3.0


def scaled_fwd(x):
    return scaled(x), None


def scaled_bwd(_, g):
    return (lax.fori_loop(0, 3, lambda i, acc: acc + g, jnp.zeros(g.shape)),)


scaled.defvjp(scaled_fwd, scaled_bwd)
'''

USES_CUSTOM_VJP = USES_KERNELS.replace('''    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b''', '''    return kernels.scaled(x)''')


#: a Pallas kernel (interpret mode: it runs on CPU) whose out_shape is built as production
#: kernels build it (haoliuhl/ringattention's flash attention): a list, `+=`, a partial of
#: `jax.ShapeDtypeStruct` for a scratch output, an argument list over two lines
PALLAS = '''import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref, acc_ref):
    acc_ref[...] = x_ref[...] * 2.0
    o_ref[...] = acc_ref[...] + 1.0


def double_plus_one(x):
    scratch = functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32)
    out_shape = [jax.ShapeDtypeStruct(
        x.shape, x.dtype
    )]
    out_shape += [scratch(x.shape)]
    out, _ = pl.pallas_call(_kernel, out_shape=out_shape, interpret=True)(x)
    return out
'''

USES_PALLAS = USES_KERNELS.replace('''    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b''', '''    return kernels.double_plus_one(x)''')

#: the same backward pass as a while_loop whose initial carry, a pair, is made by a helper
#: function: no edit of the call reaches its second component
CUSTOM_VJP_HELPER = CUSTOM_VJP.replace(
    "def scaled_bwd(_, g):\n    return (lax.fori_loop(0, 3, lambda i, acc: acc + g, jnp.zeros(g.shape)),)",
    "def start(g):\n    return (0, jnp.zeros(g.shape))\n\n\ndef scaled_bwd(_, g):\n"
    "    return (lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + g), start(g))[1],)")

#: an equinox module as a kernel library writes one (`jax.nn` inside `__call__`, a weight
#: field), whose `fori_loop` starts its accumulator Invariant; the script's shard_map body
#: calls a module-level instance
EQX = '''import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax


class Accumulate(eqx.Module):
    w: jax.Array

    def __call__(self, x):
        def body(i, acc):
            return acc + jax.nn.gelu(x @ self.w) * i

        return lax.fori_loop(0, 3, body, jnp.zeros(x.shape))
'''

USES_EQX = USES_KERNELS.replace('''def body(x):
    a, b = kernels.gate(x)
    return kernels.ring_sum(a, "sp") + b''', '''model = kernels.Accumulate(jnp.eye(4) / 2)


def body(x):
    return model(x)''')

def _project(tmp_path, kernels_text, script_text):
    """The kernels and the script in their own folder; `(script path, kernels path, module
    name)`."""
    return module_project(tmp_path, kernels_text, script_text, prefix="kernels",
                          script="train.py")


def _load_project(monkeypatch, folder, name):
    """The script of `folder`, importing its kernel module `name` from there."""
    with monkeypatch.context() as m:
        m.syspath_prepend(str(folder))
        m.delitem(sys.modules, name, raising=False)
        module = _load(folder / "train.py")
        m.delitem(sys.modules, name, raising=False)
    return module


def test_an_edit_in_a_kernel_module_given_with_the_script(tmp_path, capsys, monkeypatch):
    """`port --enable-vma train.py kernels.py`: the scan's initial carry and the gate's
    Invariant branch output are edited in the kernel module, where they are written; the
    migrated pair runs with the checks on and computes the original's numbers."""
    script, kernels, name = _project(tmp_path, KERNELS, USES_KERNELS)
    original = _load_project(monkeypatch, script.parent, name)
    want = np.asarray(original.run(original))
    assert _port_cli.main(["--enable-vma", "--write", str(script), str(kernels)]) == 0
    out, err = capsys.readouterr()
    assert f"migrated {script} to check_vma=True" in out
    assert f"edited {kernels}: the edits JAX asks for with check_vma=True" in out
    new = kernels.read_text()
    assert "lambda v: (v, " + _compat.vary_cast_source("jnp.ones(v.shape)", ("sp",)) + ")" in new
    assert "(" + _compat.vary_cast_source("jnp.zeros(x.shape)", ("sp",)) + ", x)" in new
    assert len(new.splitlines()) == len(KERNELS.splitlines())
    assert "check_vma=True" in script.read_text()
    # each edit is reported at the kernel module's line
    assert f"{kernels}:{_line(KERNELS, 'lax.cond(')}: cond: the output of false_fun[1]" in err
    assert f"{kernels}:{_line(KERNELS, 'lax.scan(')}: scan: the initial carry[0]" in err
    assert "JAX still rejects" not in err
    migrated = _load_project(monkeypatch, script.parent, name)
    np.testing.assert_allclose(np.asarray(migrated.run(migrated)), want, rtol=1e-6, atol=1e-6)
    # one device: every block is positive, so the gate doubles it (and adds 1 to the other
    # output), and the ring sums the four doubled blocks
    _equals_one_device(migrated,
                       lambda x: jnp.tile(2 * x.reshape(4, 2, 4).sum(0), (4, 1)) + x + 1)
    # and nothing is left to migrate in the pair
    assert _port_cli.main(["--enable-vma", str(script), str(kernels)]) == 0
    assert "nothing to migrate" in capsys.readouterr().err


def test_a_kernel_module_not_given_is_named_in_the_report(tmp_path, capsys):
    """The script alone: JAX's error is raised in the kernel module, which is not rewritten;
    the report says where the edit belongs and how to make it."""
    script, kernels, name = _project(tmp_path, KERNELS, USES_KERNELS)
    assert _port_cli.main(["--enable-vma", str(script)]) == 1
    err = capsys.readouterr().err
    assert "JAX still rejects:" in err
    assert (f"(raised in {name}.py:{_line(KERNELS, 'lax.cond(')}: the edit belongs there; give "
            f"{name}.py to port --enable-vma too)") in err
    assert kernels.read_text() == KERNELS


def _migrates_pair(tmp_path, capsys, monkeypatch, kernels_text, script_text, reference):
    """Port the script and its kernel module together; the kernel module's new text and the
    report. The migrated pair's output and gradient (of `sum(sin(out))`, taken outside the
    shard_map) equal the original's, and one device's: `reference`, the whole computation on
    the global array."""
    script, kernels, name = _project(tmp_path, kernels_text, script_text)
    original = _load_project(monkeypatch, script.parent, name)
    assert _port_cli.main(["--enable-vma", "--write", str(script), str(kernels)]) == 0
    err = capsys.readouterr().err
    assert "JAX still rejects" not in err
    migrated = _load_project(monkeypatch, script.parent, name)
    np.testing.assert_allclose(np.asarray(migrated.run(migrated)),
                               np.asarray(original.run(original)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_grad(migrated), _grad(original), rtol=1e-6, atol=1e-6)
    _equals_one_device(migrated, reference)
    return kernels.read_text(), err, kernels


def _grad(m):
    """The gradient of `sum(sin(m.fused(x)))` at the module's `x`, taken outside the
    shard_map."""
    with jax.set_mesh(m.mesh):
        return np.asarray(jax.jit(jax.grad(lambda x: jnp.sum(jnp.sin(m.fused(x)))))(m.x))


def _equals_one_device(m, reference):
    """The module's shard_map computes `reference` (the whole computation on the global
    array, on one device), its output and its gradient (`_grad`)."""
    x = jnp.asarray(np.asarray(m.x))
    np.testing.assert_allclose(np.asarray(m.run(m)), np.asarray(reference(x)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(_grad(m),
                               np.asarray(jax.grad(lambda x: jnp.sum(jnp.sin(reference(x))))(x)),
                               rtol=1e-5, atol=1e-6)


def test_a_branch_returning_the_carry_it_took_casts_the_loops_initial_carry(
        tmp_path, capsys, monkeypatch):
    """JAX names the mismatched components of the skipping branch's output by their paths
    into the carry (`[0][0]`, `[0][1]`); the branch returns the carry it was given, so the
    Invariant value is the scan's initial carry: the cast goes there (not once per component
    around the branch's output, nested casts that JAX refuses)."""
    # one device: each block gets itself twice in each of the two components
    new, err, kernels = _migrates_pair(tmp_path, capsys, monkeypatch, SKIP, USES_SKIP,
                                       lambda x: 4 * x)
    cast = _compat.vary_cast_source("jnp.zeros(x.shape)", ("sp",))
    assert f"lax.scan(body, ({cast}, {cast}), jnp.arange(4))" in new
    assert "lambda c: (c, None)" in new and new.count("pcast") == 2
    assert f"{kernels}:{_line(SKIP, 'lax.scan(')}: scan: the initial carry[1]" in err


def test_a_cast_made_redundant_by_an_outer_loops_is_taken_back(tmp_path, capsys, monkeypatch):
    """Ring attention's shape: JAX names the blockwise loop first, then the ring's carry; once
    the ring carries its accumulator Varying, the blockwise loop's cast is of a Varying value
    (JAX refuses it) and is taken back: the migrated module has the ring's cast only."""
    # one device: each device's accumulator is (0 + 2) times the sum of the four blocks
    new, err, kernels = _migrates_pair(tmp_path, capsys, monkeypatch, NESTED, USES_NESTED,
                                       lambda x: jnp.tile(2 * x.reshape(4, 2, 4).sum(0), (4, 1)))
    assert new.count("pcast") == 1
    assert "(" + _compat.vary_cast_source("jnp.zeros(x.shape)", ("sp",)) + ", x)" in new
    assert "lax.scan(blockwise, (acc,), jnp.arange(4))" in new
    assert f"{kernels}:{_line(NESTED, 'lax.scan(ring')}: scan: the initial carry[0]" in err
    assert f"{kernels}:{_line(NESTED, 'lax.scan(blockwise')}" not in err


def test_the_gradients_backward_program_is_migrated_too(tmp_path, capsys, monkeypatch):
    """A `custom_vjp` whose backward pass starts a loop Invariant: the forward program is
    accepted with the checks on, and the gradient's is not. The migration traces the gradient
    as well, and casts the backward loop's initial carry."""
    new, err, kernels = _migrates_pair(tmp_path, capsys, monkeypatch, CUSTOM_VJP,
                                       USES_CUSTOM_VJP, lambda x: 3 * x)
    assert ("lax.fori_loop(0, 3, lambda i, acc: acc + g, "
            + _compat.vary_cast_source("jnp.zeros(g.shape)", ("sp",)) + ")") in new
    assert f"{kernels}:{_line(CUSTOM_VJP, 'fori_loop(')}: fori_loop: the initial carry" in err


def test_a_pallas_kernels_out_shape_gets_its_outputs_states(tmp_path, capsys, monkeypatch):
    """With the checks on, JAX needs the states of a `pallas_call`'s outputs in its
    `ShapeDtypeStruct`s (`manual_axis_type`): each one the kernel's function builds gets it
    (the partial of the scratch output too), the line count stays the module's, and the
    migrated kernel is accepted with `check_vma=True`. (A `pallas_call` has no derivative: the
    gradient, not traced either way, is not asked for.)"""
    script, kernels, name = _project(tmp_path, PALLAS, USES_PALLAS)
    original = _load_project(monkeypatch, script.parent, name)
    # the kernel as written runs (check_vma=False): 2x + 1 on each device's block
    np.testing.assert_allclose(np.asarray(original.run(original)),
                               2 * np.asarray(original.x) + 1)
    assert _port_cli.main(["--enable-vma", "--write", str(script), str(kernels)]) == 0
    err = capsys.readouterr().err
    new = kernels.read_text()
    state = "manual_axis_type=jax.sharding.ManualAxisType(varying={'sp'})"
    assert f"x.shape, x.dtype, {state}" in new
    assert f"functools.partial(jax.ShapeDtypeStruct, dtype=jnp.float32, {state})" in new
    assert len(new.splitlines()) == len(PALLAS.splitlines())
    assert (f"{kernels}:{_line(PALLAS, 'pl.pallas_call(')}: pallas_call: its out_shape's "
            "ShapeDtypeStructs say nothing of the outputs' states") in err
    assert "(2 edited)" in err and "JAX still rejects" not in err
    # JAX accepts the migrated kernel with the checks on (traced; interpret mode's HLO
    # interpreter cannot run a kernel under check_vma=True: "Primitive mul requires varying
    # manual axes to match", JAX's own failure. On a TPU the migrated ringattention kernel
    # runs, bit for bit the original's: docs/porting.md)
    migrated = _load_project(monkeypatch, script.parent, name)
    assert "check_vma=True" in script.read_text()
    jaxpr = jax.make_jaxpr(migrated.fused)(migrated.x)
    assert "pallas_call" in str(jaxpr)


def test_an_error_only_the_gradient_meets_is_reported_as_the_gradients(tmp_path, capsys):
    """The forward program is accepted with the checks on; the backward pass's loop starts
    from a helper's result, which no edit reaches: the report says the error is the
    gradient's (code that is never differentiated can ignore it)."""
    assert "start(g)" in CUSTOM_VJP_HELPER
    script, kernels, name = _project(tmp_path, CUSTOM_VJP_HELPER, USES_CUSTOM_VJP)
    assert _port_cli.main(["--enable-vma", str(script), str(kernels)]) == 1
    err = capsys.readouterr().err
    assert "JAX still rejects:" in err
    assert (f"{kernels}:{_line(CUSTOM_VJP_HELPER, 'while_loop(')}: SPMD302: JAX rejects it with "
            "check_vma=True") in err
    assert ("(in the gradient: the backward program JAX traces under jax.grad; the forward "
            "program is accepted)") in err


def test_modules_of_the_same_name_in_two_folders_migrate_each_on_its_own(tmp_path, capsys):
    """`port --enable-vma a/train.py b/train.py`: modules are imported under their file
    names, so neither can be the other's helper; each is migrated as it would be alone."""
    paths = []
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        paths.append(tmp_path / folder / "train.py")
        paths[-1].write_text(textwrap.dedent(LOOP))
    assert _port_cli.main(["--enable-vma", "--write", *map(str, paths)]) == 0
    err = capsys.readouterr().err
    cast = _compat.vary_cast_source("jnp.zeros(x.shape)", ("dp",))
    for path in paths:
        assert f"jax.lax.fori_loop(0, 4, body, {cast})" in path.read_text()
        assert f"{path}:{_line(LOOP, 'fori_loop(')}: fori_loop: the initial carry" in err


def test_a_kernel_module_with_its_own_uncalled_shard_map_is_edited_not_migrated(
        tmp_path, capsys):
    """A kernel module with a `check_vma=False` shard_map of its own that nothing calls at
    import (a `test_main()` of jax-llm-examples' kernels): its edits are the casts the
    script's body needs, and its own shard_map is left as written. That shard_map cannot be
    traced (nothing says its shapes): the error is reported (exit 2), and the script and the
    kernel module's edits are written all the same."""
    own = KERNELS + '''

def test_main(x, mesh):
    return jax.shard_map(ring_sum, mesh=mesh, in_specs=None, out_specs=None, check_vma=False)(x)
'''
    script, kernels, name = _project(tmp_path, own, USES_KERNELS)
    assert _port_cli.main(["--enable-vma", "--write", str(script), str(kernels)]) == 2
    out, err = capsys.readouterr()
    assert f"error: cannot migrate {kernels}: ValueError: {name}.py:" in err
    assert "cannot tell its mesh, out-specs, shapes" in err
    assert f"migrated {script} to check_vma=True" in out
    assert f"edited {kernels}: the edits JAX asks for with check_vma=True" in out
    assert "check_vma=False)(x)" in kernels.read_text() and "pcast" in kernels.read_text()


#: a Pallas kernel called from a lambda body at module level, next to a module-level
#: ShapeDtypeStruct that is no kernel's output
PALLAS_LAMBDA = HEAD + '''from jax.experimental import pallas as pl

mesh = jax.make_mesh((4,), ("sp",))
x = jax.device_put(jnp.arange(32.0).reshape(8, 4) / 32, NamedSharding(mesh, P("sp")))
ABSTRACT = jax.ShapeDtypeStruct((8, 4), jnp.float32)


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


fused = jax.shard_map(
    lambda x: pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                             interpret=True)(x),
    mesh=mesh, in_specs=P("sp"), out_specs=P("sp"), check_vma=False)


def run(m):
    return m.fused(m.x)


if __name__ == "__main__":
    print(fused(x))
'''


def test_a_pallas_call_outside_any_function_edits_its_own_out_shape_only(tmp_path, capsys):
    """A `pallas_call` in a lambda body at module level: the `ShapeDtypeStruct`s written in
    the call get the outputs' states, and a module-level one that is no kernel's output is
    left as written."""
    path = _write(tmp_path, PALLAS_LAMBDA)
    assert _port_cli.main(["--enable-vma", "--write", str(path)]) == 0
    new = path.read_text()
    state = "manual_axis_type=jax.sharding.ManualAxisType(varying={'sp'})"
    assert f"out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype, {state})" in new
    assert "ABSTRACT = jax.ShapeDtypeStruct((8, 4), jnp.float32)\n" in new
    assert "(1 edited)" in capsys.readouterr().err
    jax.make_jaxpr(_load(path).fused)(_load(path).x)


def test_an_equinox_modules_loop_is_migrated_in_its_module(tmp_path, capsys, monkeypatch):
    """The kernel is an `eqx.Module` (`jax.nn.gelu` in `__call__`): its `fori_loop`'s initial
    carry is cast in the module's file, and the migrated pair's output and gradient equal the
    original's and one device's."""
    assert "model = kernels.Accumulate" in USES_EQX
    new, err, kernels = _migrates_pair(tmp_path, capsys, monkeypatch, EQX, USES_EQX,
                                       lambda x: 3 * jax.nn.gelu(x @ (jnp.eye(4) / 2)))
    assert ("lax.fori_loop(0, 3, body, "
            + _compat.vary_cast_source("jnp.zeros(x.shape)", ("sp",)) + ")") in new
    assert f"{kernels}:{_line(EQX, 'fori_loop(')}: fori_loop: the initial carry" in err

"""`port --enable-vma` on every complete program of the suites written with `check_vma=False`
(`VMA_OFF`: read from where the suites declare them, never copied here), and on a ring
attention with `jax.custom_vjp`, `lax.scan` and `lax.cond` written for `check_vma=False`.

For each: the program is written as a module file, `port --enable-vma --write` run on it, the
result imported: no `check_vma=False` left, JAX accepts it with the checks on (the import runs
it), its numbers equal the original's and the single-device reference's, and every report line
is the expected one at its line (`FILE:LINE: ...`), nothing else reported. A program whose
numbers change (an explicit psum of a gradient JAX now sums itself) gets the fix the report
names applied, and then equals the original.

Left out, each a snippet that exists to test one error or limitation (not a program to
migrate): test_bad_inputs.py's "Varying output through P() with check_vma=False" (SPMD401
under `st.shard_map`), test_core.py's `forgot_psum` (a BoundaryError) and `typed` (typed
states under check_vma=False, `pytest.raises` inside its body; its raw twin `raw` is here),
test_protocols.py's SPMD202 body, test_faults.py's `psum over a vmap axis` (with the checks on
JAX itself fails: SPMD503), test_adapters.py's `typed_shard_map(..., check_vma=False)` (the body
of test_lax.py's `j_smap`, through the adapter, which `--enable-vma` does not read), and the 47
`check_vma=False` tests of JAX's own suite (tests/jax_suite, each one JAX behaviour)."""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import textwrap
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import assert_trees_close
from test_migrate_vma import _load, _write

from spmdtyped._cli import port as _port_cli

TESTS = pathlib.Path(__file__).resolve().parent


def nested(file: str, test: str, *names: str) -> str:
    """The statements of the test function `test` of `file` that define `names` (a `def`
    or an assignment), dedented, in their order: one source per program."""
    tree = ast.parse((TESTS / file).read_text())
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == test)
    source = (TESTS / file).read_text()
    out = []
    for stmt in fn.body:
        defined = [stmt.name] if isinstance(stmt, ast.FunctionDef) else \
            [t.id for t in getattr(stmt, "targets", []) if isinstance(t, ast.Name)]
        if set(defined) & set(names):
            out.append(textwrap.dedent(" " * stmt.col_offset + ast.get_source_segment(source, stmt)))
    assert len(out) == len(names), (file, test, names)
    return "\n\n\n".join(out) + "\n"


def string_in(file: str, name: str, test: str | None = None) -> str:
    """The string constant bound to `name` (at module level, or in the test function `test`)."""
    tree = ast.parse((TESTS / file).read_text())
    scope = tree if test is None else next(
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == test)
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Call):  # textwrap.dedent('''...''')
                value = value.args[0]
            return textwrap.dedent(value.value)
    raise LookupError(name)


HEAD = '''import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

'''


@dataclasses.dataclass
class Program:
    """One check_vma=False program: the module text, the flags its call needs, the module
    attributes its outputs are bound to at import, a single-device reference of them (a
    function of the loaded module, None: the program has none), and the report it must get:
    (a fragment of the reported line, a fragment of the report there)."""

    name: str
    text: str
    outputs: tuple[str, ...]
    report: tuple[tuple[str, str], ...]
    reference: Callable[[Any], Any] | None = None
    flags: tuple[str, ...] = ()
    status: int = 0
    #: the fix the report names, applied to the migrated text (programs whose numbers change)
    fixed: Callable[[str], str] | None = None


def _one_device(*arrays):
    return tuple(jnp.asarray(np.asarray(a)) for a in arrays)


def _sgd_reference(m):
    w0, x, y = _one_device(m.w, m.x, m.y)

    def loss(w):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    value, g = jax.value_and_grad(loss)(w0)
    return ((w0 - 0.1 * g, value),)


def _drop_psum(text: str) -> str:
    """The fix the report names for SPMD103 on a gradient: drop the psum."""
    return re.sub(r"jax\.lax\.psum\((\w+), \"dp\"\)(?=.*# VMA)", r"\1", text)


LAX_HEAD = HEAD + '''import spmdtyped.lax as slax

mesh_dp_tp = jax.make_mesh((2, 4), ("dp", "tp"))
X = jax.device_put(jnp.arange(4.0), NamedSharding(mesh_dp_tp, P("dp")))


'''

CHECK_ON = "jax.shard_map(..., check_vma=False): JAX's manual-axis checks were off; fix: check_vma=True"

VMA_OFF = [
    Program(
        "porting_styles/vma_off_grads",
        (TESTS / "porting_styles" / "vma_off_grads.py").read_text() + '''

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
w, x, y = make_args(mesh)
step = jax.shard_map(sgd, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS, check_vma=False)
OUT = step(w, x, y)
''',
        ("OUT",),
        (("step = jax.shard_map(sgd", CHECK_ON),
         ("step = jax.shard_map(sgd", "jax.shard_map(sgd): with check_vma=True the outputs differ"),
         ("# VMA: SPMD103", "SPMD103: psum of a value that is already Invariant (a gradient of "
          "a replicated parameter: with check_vma=True JAX's transpose sums it); the explicit "
          "psum now multiplies it by the axis size; fix: drop the psum")),
        _sgd_reference, status=1, fixed=_drop_psum),
    Program(
        "test_cli_module.VMA_OFF_AND_HELPER",
        string_in("test_cli_module.py", "VMA_OFF_AND_HELPER"),
        ("LEGACY", "RESULT"),
        (("@partial(jax.shard_map", CHECK_ON),),
        lambda m: (jnp.tanh(_one_device(m.x)[0] @ _one_device(m.w)[0]).reshape(2, 4, 4).sum(0),)),
    Program(
        "test_core.test_check_vma_false_tracks_states_itself",
        HEAD + '''from _helpers import mesh_ij as _mesh_ij, put

mesh_ij = _mesh_ij()


''' + nested("test_core.py", "test_check_vma_false_tracks_states_itself", "raw", "args", "specs",
             "ref"),
        ("ref",),
        (("check_vma=False", CHECK_ON),),
        lambda m: (jnp.arange(64.0).reshape(8, 8) @ jnp.ones((8, 3)),),
        flags=("--shapes", "f32[8,8] f32[8,3]")),
    Program(
        "test_lax.test_passthrough_with_check_vma_false.f_smap",
        LAX_HEAD + nested("test_lax.py", "test_passthrough_with_check_vma_false", "f", "f_smap"),
        (),
        (("f_smap = ", CHECK_ON),
         ("return slax.psum(x, \"tp\")", "SPMD103: spmdtyped.lax rejects it with check_vma=True"
          ": st.psum over 'tp': the value is already Invariant there")),
        flags=("--shapes", "f32[4]"), status=1),
    Program(
        "test_lax.test_passthrough_with_check_vma_false.j_smap",
        LAX_HEAD + nested("test_lax.py", "test_passthrough_with_check_vma_false", "j_smap")
        + "\n\nJ_OUT = j_smap(X)\n",
        ("J_OUT",),
        (("out_specs=P(\"dp\"), check_vma=False)", CHECK_ON),
         ("j_smap = ", "SPMD103: psum of a value that is already Invariant: the outputs agree")),
        lambda m: (4 * np.arange(4.0),)),
    Program(
        "test_cli_module.test_codemod_forms_without_tracing",
        string_in("test_cli_module.py", "src", "test_codemod_forms_without_tracing"),
        (),
        (("old = shard_map(", CHECK_ON), ("old = shard_map(", "SPMD401")),
        flags=("--mesh", "dp=2,tp=4", "--shapes", "f32[8,4]"), status=1),
]


def _line(text, fragment):
    return next(i for i, t in enumerate(text.splitlines(), 1) if fragment in t)


def _close(a, b):
    assert_trees_close(a, b, rtol=1e-5, atol=1e-5)


def _vma_off(text):
    """The lines of the `check_vma=False` keywords in `text` (its code, not its prose)."""
    return [k.value.lineno for k in ast.walk(ast.parse(text)) if isinstance(k, ast.keyword)
            and k.arg == "check_vma" and isinstance(k.value, ast.Constant) and k.value.value is False]


def _outputs(m, prog):
    return tuple(getattr(m, name) for name in prog.outputs)


@pytest.mark.parametrize("prog", VMA_OFF, ids=[p.name for p in VMA_OFF])
def test_suite_program_migrates(prog, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    path = _write(tmp_path, prog.text)
    original = _load(_write(tmp_path, prog.text))
    status = _port_cli.main(["--enable-vma", "--write", str(path), *prog.flags])
    err = capsys.readouterr().err
    assert status == prog.status, err
    new = path.read_text()
    assert not _vma_off(new) and _vma_off(prog.text)
    # every report line is an expected one, at its line
    lines = [t.strip() for t in err.splitlines() if t.strip().startswith(f"{path}:")]
    for fragment, said in prog.report:
        want = f"{path}:{_line(prog.text, fragment)}: "
        assert any(t.startswith(want) and said in t for t in lines), (want, said, err)
    assert len(lines) == len(prog.report), err
    if prog.reference is not None:
        want = prog.reference(original)  # the first outputs' single-device values
        _close(_outputs(original, prog)[:len(want)], want)
    if prog.status == 0:
        migrated = _load(path)  # JAX accepts it: the import runs it with the checks on
        _close(_outputs(migrated, prog), _outputs(original, prog))
    elif prog.fixed is not None:
        fixed = _load(_write(tmp_path, prog.fixed(new)))
        _close(_outputs(fixed, prog), _outputs(original, prog))


RING = TESTS / "porting_vma" / "ring_custom_vjp.py"


def _attention(q, k, v, scale):
    n = q.shape[0]
    s = jnp.where(jnp.tril(jnp.ones((n, n), bool)), q @ k.T * scale, -jnp.inf)
    return jax.nn.softmax(s, axis=-1) @ v


def test_ring_attention_with_custom_vjp_scan_and_cond(tmp_path, capsys):
    """Migrated: the forward and both gradients (jax.grad outside the shard_map and inside)
    equal a single-device causal attention's; JAX accepts it with the checks on (the import
    runs all three); each edit reported at its line, nothing else."""
    text = RING.read_text()
    path = _write(tmp_path, text)
    original = _load(_write(tmp_path, text))
    assert _port_cli.main(["--enable-vma", "--write", str(path)]) == 0
    err = capsys.readouterr().err
    new = path.read_text()
    assert not _vma_off(new) and len(_vma_off(text)) == 2
    migrated = _load(path)
    q, k, v, w = _one_device(original.q, original.k, original.v, original.w)
    want = _attention(q, k, v, original.SCALE)
    grads = jax.grad(lambda q, k, v: jnp.sum(_attention(q, k, v, original.SCALE) * w),
                     argnums=(0, 1, 2))(q, k, v)
    for m in (original, migrated):
        _close(m.OUT, want)
        _close(m.GRADS_OUTSIDE, grads)
        _close(m.GRADS_INSIDE, grads)
    reported = sorted((int(t.split(":")[1]), t.split(": ", 1)[1].split(";")[0])
                      for t in (s.strip() for s in err.splitlines()) if t.startswith(f"{path}:"))
    lines = text.splitlines()
    conds = [i for i, t in enumerate(lines, 1) if "src > idx, lambda: (" in t]
    inits = [i for i, t in enumerate(lines, 1) if t.startswith("    init = (")]
    want_lines = sorted(
        [(i, "jax.shard_map(..., check_vma=False): JAX's manual-axis checks were off")
         for i in _vma_off(text)]
        + [(i, f"cond: the output of true_fun[{j}] is Invariant and the other branch's is "
            "Varying over sp") for i in conds for j in range(3)]
        + [(i, f"scan: the initial carry[{j}] is Invariant and the body makes it Varying over sp")
           for i in inits for j in range(3)])
    assert len(conds) == len(inits) == 2 and reported == want_lines, err
    assert "what changes the numbers" not in err


def _walk_blocks():
    """The fenced blocks of docs/porting.md's "One program all the way", in order."""
    doc = (TESTS.parent / "docs" / "porting.md").read_text()
    part = doc.split("### One program all the way", 1)[1].split("\n## ", 1)[0]
    return [textwrap.dedent(b) for b in re.findall(r"\n( *)```\w+\n(.*?)\n\1```", part, re.S)
            for b in [b[1]]]


def test_docs_walk_migrate_port_mypy(tmp_path, capsys):
    """docs/porting.md walks test_migrate_vma.DP_STEP (check_vma=False) through
    `port --enable-vma`, the fixes its report names, `port` and mypy with the plugin: each
    step's output is the one shown, and the numbers stay the original's."""
    from test_migrate_vma import DP_STEP
    from test_typing_cli import check

    diff, ported, mypy_kept = _walk_blocks()
    text = textwrap.dedent(DP_STEP)
    train = tmp_path / "train.py"
    train.write_text(text)
    original = _load(_write(tmp_path, text))
    assert _port_cli.main(["--enable-vma", "--write", str(train)]) == 1
    migrated = train.read_text()
    capsys.readouterr()
    # 1. the fixes the report names, as the diff shows them
    removed = [t[1:] for t in diff.splitlines() if t.startswith("-")]
    added = [t[1:] for t in diff.splitlines() if t.startswith("+")]
    assert "\n".join(removed) in migrated
    fixed = migrated.replace("\n".join(removed), "\n".join(added))
    train.write_text(fixed)
    (tmp_path / "kept.py").write_text(migrated)
    mod = _load(_write(tmp_path, fixed))
    np.testing.assert_allclose(np.asarray(mod.run(mod)), np.asarray(original.run(original)),
                               rtol=1e-6)
    # 2. port: the typed functions shown
    for name in ("train.py", "kept.py"):
        assert _port_cli.main(["--write", str(tmp_path / name)]) == 0
    typed = train.read_text()
    assert ported.strip() in typed, typed
    out = _load(_write(tmp_path, typed))
    np.testing.assert_allclose(np.asarray(out.run(out)), np.asarray(original.run(original)),
                               rtol=1e-6)
    # 3. mypy with the plugin: train.py clean, kept.py's psum at its line
    proc = check(tmp_path, "train.py", "kept.py")
    errors = [t for t in proc.stdout.splitlines() if ": error: " in t]
    assert errors == [mypy_kept.strip()], proc.stdout + proc.stderr
    kept_line = int(mypy_kept.split(":")[1])
    assert (tmp_path / "kept.py").read_text().splitlines()[kept_line - 1].strip() == \
        'g = st.psum(g, "dp")'

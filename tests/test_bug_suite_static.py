"""The bug suite, statically: ONE mypy run with the plugin over `bugs/_static_ports.py` (the
bodies of `bugs._typed` with hints the plugin reads: jaxtyping dims or `st.Shard["tp", -1]`).

Asserted: the run reports exactly one error per caught class, with the expected `spmd-*` code,
at its `# BUG(<class>)` line, and nothing else (every fixed port checks clean: no false
positive); the code is the runtime's (`bugs._typed.PORTS`) where the runtime port has one; every
class of `bugs.BUG_CLASSES` is either caught or listed in `OUT_OF_STATIC_REACH` with the reason.
Prints `static N/M`.
"""

from __future__ import annotations

import collections
from pathlib import Path

import bugs
from test_typing import CACHE, mypy_config, mypy_errors, run_mypy

from spmdtyped._mypy.codes import CODES

PORTS_FILE = Path(bugs.__file__).parent / "_static_ports.py"

#: class -> the SPMD code mypy with the plugin reports at its `# BUG(<class>)` line
STATIC: dict[str, str] = {
    "row_parallel_bias": "SPMD210",            # Partial + Invariant bias
    "token_count_normaliser": "SPMD212",       # Partial divisor
    "mean_of_means": "SPMD212",                # Partial divisor
    "grad_norm_overcount": "SPMD210",          # Partial + Invariant squared norm
    "grad_clip_local_norm": "SPMD211",         # sqrt of a Partial
    "expert_grads_wrong_group": "SPMD108",     # psum of a Shard over its own axis
    "vocab_ce_missing_reduction": "SPMD211",   # log of a Partial
    "vocab_ce_doubled_reduction": "SPMD103",   # psum of an Invariant (four-state level)
    "layernorm_sharded_hidden": "SPMD210",     # Shard - Partial mean
    "softmax_vocab_sharded": "SPMD211",        # softmax over a Shard dim
    "per_example_grads_vmap": "SPMD407",       # jax.vmap(st.grad) w.r.t. an Invariant argument
    "attention_sink_heads": "SPMD215",         # sinks[:h] (h: the local head count) along the heads
}

#: the classes the plugin cannot see, and why (each is caught at runtime or by infer)
OUT_OF_STATIC_REACH: dict[str, str] = {
    "cond_axis_index_grad": "the typed program is correct: st.cond varies its operands under a "
                            "varying predicate (the gradient is right); the bug is raw lax.cond "
                            "under jax.grad, which only infer sees",
    "custom_kernel_replicated_grad": "the typed program is correct: st.opaque casts inputs and "
                                     "cotangents (the gradient is right); the bug is an untyped "
                                     "custom_vjp kernel, which only infer sees",
}

#: the number of classes caught statically today: never lower it
STATIC_FLOOR = 12


def _bug_lines() -> dict[str, int]:
    out: dict[str, list[int]] = collections.defaultdict(list)
    for n, text in enumerate(PORTS_FILE.read_text().splitlines(), 1):
        stripped = text.rstrip()
        if stripped.endswith(")") and "# BUG(" in stripped:
            out[stripped.rsplit("# BUG(", 1)[1][:-1]].append(n)
    assert all(len(v) == 1 for v in out.values()), dict(out)
    return {k: v[0] for k, v in out.items()}


def test_classes_are_partitioned() -> None:
    assert set(STATIC) | set(OUT_OF_STATIC_REACH) == set(bugs.BUG_CLASSES)
    assert not set(STATIC) & set(OUT_OF_STATIC_REACH)
    lines = _bug_lines()
    assert set(lines) == set(STATIC), "one # BUG(<class>) line per caught class, none for the others"
    source = PORTS_FILE.read_text()
    for name in STATIC:  # a buggy and a fixed port of each caught class
        assert f"def {name}_buggy(" in source and f"def {name}_fixed(" in source, name


def test_codes_agree_with_the_runtime_ports() -> None:
    from bugs import _typed

    for name, code in STATIC.items():
        if name in _typed.PORTS:
            assert _typed.PORTS[name].code == code, name


def test_bug_suite_static(tmp_path: Path) -> None:
    cfg = mypy_config(tmp_path, plugin=True)
    _, out = run_mypy([PORTS_FILE], cfg, CACHE, cwd=PORTS_FILE.parent.parent)
    got = mypy_errors(out)
    lines = _bug_lines()
    want = collections.Counter({(PORTS_FILE.name, lines[name], CODES[code].code): 1
                                for name, code in STATIC.items()})
    caught = sorted(name for name in STATIC if got[(PORTS_FILE.name, lines[name], CODES[STATIC[name]].code)])
    false_positives = sorted((got - want).elements())
    print(f"static {len(caught)}/{len(bugs.BUG_CLASSES)}; false positives {len(false_positives)}")
    assert not false_positives, f"errors outside the # BUG lines (false positives):\n{out}"
    assert got == want, f"missed: {sorted(set(STATIC) - set(caught))}\n{out}"
    assert len(caught) >= STATIC_FLOOR

"""What turning JAX's checks on changes in the numbers of a migrated module (`vma`'s step 3):
`compare` runs the original and the migrated shard_map on the same random inputs;
`gradient_psums` reads `st.adapters.infer`'s SPMD103 (a psum / pmean of an Invariant value:
typically the gradient of a replicated parameter, which JAX's transpose now sums itself);
`axis_size_idioms` finds `psum(1, axis)`.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from ... import _compat
from .._infer import abstract_args, infer
from .vma import Change
from .vma_source import func_name, lax_name


def random_inputs(job: Any, seed: int = 0) -> tuple[Any, ...]:
    """Random global arrays for `job.args` (arrays or ShapeDtypeStructs), placed as the
    in_specs say."""
    rng = np.random.default_rng(seed)
    sds = abstract_args(job.args, job.in_specs, job.mesh)

    def one(s: Any) -> Any:
        dtype = np.dtype(s.dtype)
        if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
            value = rng.standard_normal(s.shape).astype(dtype)
        elif dtype == np.bool_:
            value = rng.integers(0, 2, s.shape).astype(bool)
        else:
            value = rng.integers(0, 4, s.shape).astype(dtype)
        return jax.device_put(value, s.sharding)

    return tuple(jax.tree_util.tree_map(one, sds))


def run_job(job: Any, inputs: Sequence[Any], check_vma: bool) -> Any:
    """The outputs of `jax.jit(jax.shard_map(job.fn, ...))(*inputs)`."""
    f = _compat.shard_map(job.fn, mesh=job.mesh, in_specs=job.in_specs, out_specs=job.out_specs,
                          axis_names=job.axis_names, check_vma=check_vma)
    return jax.jit(f)(*inputs)


def compare(original: Any, migrated: Any, line: int | None, seed: int = 0) -> Change | None:
    """The report line when the migrated shard_map (check_vma=True) computes other numbers
    than the original (check_vma=False) on the same random inputs; None when they agree."""
    # the same random values, built for each program from its own arguments: a pytree class
    # of the module (a model's `QuantArray` of weights and scales) is the candidate's own
    # class in the migrated program, which JAX does not take for the original's
    want = jax.tree_util.tree_leaves(run_job(original, random_inputs(original, seed), False))
    got = jax.tree_util.tree_leaves(run_job(migrated, random_inputs(migrated, seed), True))
    diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
             if np.shape(a) == np.shape(b) else float("inf") for a, b in zip(want, got, strict=True)]
    scale = max([float(np.max(np.abs(np.asarray(a, np.float64)))) for a in want if np.size(a)]
                + [1.0])
    worst = max(diffs, default=0.0)
    if worst <= 1e-5 * scale:
        return None
    return Change(line, f"jax.shard_map({getattr(original, 'name', '?')}): with check_vma=True "
                  f"the outputs differ from check_vma=False's on the same inputs (max |diff| "
                  f"{worst:.3g})", "see the lines below (an explicit psum / pmean of a "
                  "gradient JAX now sums itself)", "numbers")


def gradient_psums(job: Any, file: str, source: str, outputs_differ: bool = True) -> list[Change]:
    """The psum / pmean of an Invariant value (SPMD103) in the migrated body: with the checks
    on, the gradient of a parameter replicated over the axis is already summed by JAX's
    transpose, and the explicit psum multiplies it by the axis size again.

    A forward psum of a replicated value multiplies it by the axis size with the checks on and
    off alike: only a gradient's changes. When the outputs agree (`outputs_differ` False:
    `compare` found none) each one is a "note", not a change of the numbers."""
    rep = infer(job.fn, *job.args, mesh=job.mesh, in_specs=job.in_specs,
                out_specs=job.out_specs, axis_names=job.axis_names)
    lines = source.splitlines()
    idioms = {c.line for c in axis_size_idioms(source)}
    out = []
    for v in rep.violations:
        line, vfile = v.line, v.file
        if v.code != "SPMD103" or line is None or \
                (vfile is not None and os.path.abspath(vfile) != os.path.abspath(file)):
            continue
        if line in idioms:
            continue  # psum(1, axis): axis_size_idioms reports it
        text = lines[line - 1] if 0 < line <= len(lines) else ""
        mean = "pmean" in text
        if not outputs_differ:
            out.append(Change(
                line, f"SPMD103: {'pmean' if mean else 'psum'} of a value that is already "
                "Invariant: the outputs agree with check_vma=False's (a replicated value, not "
                "a gradient JAX now sums)", "st.pvary it first to say so, or "
                "x * jax.lax.axis_size(axis)" if not mean else "drop the pmean", "note"))
            continue
        out.append(Change(
            line, f"SPMD103: {'pmean' if mean else 'psum'} of a value that is already Invariant "
            f"(a gradient of a replicated parameter: with check_vma=True JAX's transpose sums "
            f"it); the explicit {'pmean now gives the sum, not the mean' if mean else 'psum now multiplies it by the axis size'}",
            "divide by the axis size instead: g / jax.lax.axis_size(axis)" if mean
            else "drop the psum: the gradient is already summed over the axis", "numbers"))
    return out


def axis_size_idioms(source: str) -> list[Change]:
    """`psum(1, axis)` / `psum(1.0, axis)` for the axis size: the same number with the checks
    on (1 is Invariant: psum multiplies it by the size), so a note, not a change of the
    numbers (it decided the exit status of ringattention's migration); `jax.lax.axis_size`
    says it."""
    out = []
    lax = lax_name(source)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and func_name(node) == "psum" and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == 1 \
                and not isinstance(node.args[0].value, bool):
            axis = ast.get_source_segment(source, node.args[1]) or "axis"
            out.append(Change(node.lineno, "psum(1, axis) for the axis size: with check_vma=True "
                              "a psum of an Invariant value (the same number)",
                              f"{lax}.axis_size({axis})", "note"))
    return sorted(out, key=lambda c: c.line or 0)

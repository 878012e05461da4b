"""The refinement of Varying, part 3: what a value's *content* says across the devices of an
axis, where JAX's states and the kinds of `refine` cannot tell (issue 24, item 1).

JAX types every value that differs in layout per device Varying. Four facts about a value's
content decide whether a reduction over an axis counts each term once; the engine's walk
(`_engine/refine_content.py`) follows them through the program, these rules say what they
forbid. Pure data and functions: no JAX, no mypy.

- **gathered** over `a`: the value is (computed only from) the result of an `all_gather` over
  `a`: the same content on every device (Rep), though JAX types it Varying. A `psum` or
  `psum_scatter` over `a` counts it once per device, a second `all_gather` stacks the copies:
  SPMD103, as for an Invariant operand.
- **a slice** over `a`: a Shard that is known to be the device's slice of one global array,
  not a stack of per-device terms: the result of a tiled `psum_scatter` over `a`, or a
  replicated value sliced at an offset made from `axis_index(a)`. A `psum`/`psum_scatter`
  over `a` adds different rows elementwise: SPMD108.
- **a Shard summed and sharded again**: a `psum`/`pmean` over `a` of a Shard that an in_spec
  made (a slice of a global array *or* a stack of per-device terms: the spec cannot tell)
  whose result reaches an output that varies over `a`, is sharded over `a` by its out_spec,
  and combines the sum with another input sharded over `a` (`p - lr * pmean(g, ("dp",
  "fsdp"))`). The program maps arrays sharded over `a` to one sharded over `a`: the value was
  a slice, and the sum added different slices (SPMD108). A sum returned as is (n tiled
  copies) or combined with its own operand only (`x - pmean(x)`) stays a stack's. Under
  `st.shard_map(..., strict=True)` every such sum (and `psum_scatter`) is reported.
- **contributions** over `a`: per-device terms of a sum built by scatter-adding floating-point
  updates that vary over `a` into a zero buffer (`zeros.at[idx].add(rows)`, the combine of a
  ring expert-parallel MoE), the rows `ragged_dot` computes with this device's experts, or a
  Partial (for the slice). A replicated term added right before their
  reduction (`psum` / `psum_scatter` over `a`) is counted once per device (SPMD210);
  slicing them at this device's `axis_index(a)` instead of reducing them keeps only this
  device's terms (SPMD213).
- **a diagonal block** over `a`: the product (`dot_general`) of two operands sharded over `a`
  along dims that both stay in the result, each one a dim the other operand lacks (the
  queries' sequence and the keys' sequence of attention over a sequence sharded over `sp`;
  tokens sharded over `fsdp` times weights sharded over `fsdp` on their output dim), or the
  same table of pairs written elementwise: two operands broadcast against each other, each
  sharded over `a` along a dim the other is broadcast along (`q[:, :, None] * k[:, None, :]`,
  `x[:, None] - y[None, :]`). Each
  device computes its rows against its own columns only: the block on the diagonal, and no
  device computes the rest. Where the program brings the other blocks in (a ring of
  `ppermute`s, the unrolled collective matmul) and combines them with it, the block is one
  term of the whole and nothing is wrong; a value computed from the block alone that reaches
  an output is SPMD216 at the product.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import Arg, Shard, einsum_parse, fail, kind

#: the collectives whose operand's content these rules check, by the rule table's name
SUMMING = frozenset({"psum", "psum_scatter"})
CHECKED = SUMMING | {"all_gather"}


def gathered_operand(name: str, axis: str, op: str) -> Exception:
    """SPMD103: a collective `name` over `axis` of a value gathered over `axis`."""
    what = {"psum": "sums the copies: n times the gathered value (a double count)",
            "psum_scatter": "sums the copies before scattering them: n times each slice",
            "all_gather": "gathers the copies again: n stacked copies of the gathered array"}
    return fail("SPMD103", op, f"the value is the result of an all_gather over {axis!r}: its "
                f"content is the same on every device (Rep), though JAX types it Varying; a "
                f"{name} over {axis!r} {what.get(name, 'moves identical data')}", axis, None,
                fix=f"use the gathered value as it is (drop the {name}); to reduce, reduce the "
                    f"operand before the all_gather over {axis!r}")


def summed_slice(name: str, axis: str, dim: int, why: str, op: str) -> Exception:
    """SPMD108: a sum over `axis` of a slice of a global array along `dim` (`why`: what
    says it is a slice and not a stack of per-device terms)."""
    return fail("SPMD108", op, f"the value is a slice of a global array along dim {dim} over "
                f"{axis!r} ({why}); a {name} over {axis!r} adds different slices of it "
                f"elementwise (different rows or parameters summed)", axis, None,
                fix=f"reduce over the axes the value is replicated on only (not {axis!r}); "
                    f"jax.lax.all_gather(x, {axis!r}, axis={dim}, tiled=True) to assemble the "
                    f"array")


#: what tells a Shard is a slice (the `why` of `summed_slice`)
SCATTERED = "the result of a tiled psum_scatter over it, or sliced at its axis_index"
RESHARDED = ("its in_spec shards it, and an output that combines the sum with another input "
             "sharded over that axis is sharded over it again by its out_spec")
STRICT = "its in_spec shards it (strict=True: a spec cannot tell a slice from a stack)"


def residual_before_reduction(name: str, axis: str, what: str, op: str) -> Exception:
    """SPMD210: a term replicated over `axis` (`what`) added to per-device terms that a
    `name` over `axis` reduces right after."""
    return fail("SPMD210", op, f"{what} replicated over {axis!r} is added to per-device terms "
                f"that the {name} over {axis!r} right after reduces: it is counted once per "
                f"device (n times), as a bias added before the reduction", axis, None,
                fix=f"reduce first, then add it: jax.lax.{name}(acc, {axis!r}, ...) + residual "
                    f"(its slice after a psum_scatter), or add residual / "
                    f"jax.lax.axis_size({axis!r}) before the reduction")


def sliced_contributions(axis: str, op: str) -> Exception:
    """SPMD213: per-device terms of a sum over `axis` sliced at `axis_index(axis)`."""
    return fail("SPMD213", op, f"per-device terms of a sum over {axis!r} (scatter-added "
                f"contributions or partial sums) are sliced at this device's axis_index "
                f"({axis!r}) instead of reduced: each device keeps only its own terms of its "
                f"rows, the other devices' contributions are dropped", axis, None,
                fix=f"jax.lax.psum_scatter(acc, {axis!r}, scatter_dimension=d, tiled=True)  "
                    f"# reduce, then keep this device's rows")


#: the collectives that bring other devices' data in over their axes (the blocks a diagonal
#: block lacks: a ring of `ppermute`s, an `all_gather`, an `all_to_all`), by the rule table's
#: name
MOVING = frozenset({"ppermute", "all_gather", "all_to_all"})
#: the ops that combine a diagonal block with the blocks brought in (a ring's online softmax,
#: the collective matmul's updates into its result), by primitive name
COMBINING = frozenset({"add", "add_any", "sub", "max", "min", "select_n", "concatenate",
                       "dynamic_update_slice", "scatter", "scatter-add", "scatter_add"})


def apart_shards(spec: str, args: Sequence[Arg], axes: Iterable[str]
                 ) -> list[tuple[str, int, int]]:
    """The axes of `axes` over which the product `einsum(spec, *args)` of two operands is a
    diagonal block: the left operand is sharded over the axis along a dim the right one lacks,
    the right along a dim the left one lacks, and both dims stay in the result (`bqhd,bkhd->
    bhqk` of queries and keys sharded over `sp` along the sequence). Each as (axis, the left
    operand's dim, the right one's dim), dims counted from the right."""
    parsed = einsum_parse(spec, len(args)) if len(args) == 2 else None
    if parsed is None:
        return []
    (left, right), result = parsed
    found = []
    for a in sorted(axes):
        kl, kr = kind(args[0].type, args[0].ref, a), kind(args[1].type, args[1].ref, a)
        if not (isinstance(kl, Shard) and isinstance(kr, Shard)) \
                or -kl.dim > len(left) or -kr.dim > len(right):
            continue
        cl, cr = left[kl.dim], right[kr.dim]
        if cl != cr and cl not in right and cr not in left and cl in result and cr in result:
            found.append((a, kl.dim, kr.dim))
    return found


#: the elementwise ops whose two operands, broadcast against each other, make a table of pairs
#: (`x[:, None] * y[None, :]`, the scores `(q[:, :, None] * k[:, None, :]).sum(-1)`, pairwise
#: differences), by primitive name: `apart_broadcasts` reads them as it reads a product
PAIRING = frozenset({"mul", "add", "sub", "div"})


def apart_broadcasts(args: Sequence[Arg], axes: Iterable[str]) -> list[tuple[str, int, int]]:
    """The axes of `axes` over which an elementwise op (`PAIRING`) of two operands broadcast
    against each other is a diagonal block, as `apart_shards` finds one of a product: the left
    operand is sharded over the axis along a dim the right one is broadcast along (extent 1 in
    `Arg.shape`, the extents the operands really have), and the right along a dim the left one
    is broadcast along. Each as (axis, the left operand's dim, the right one's dim), dims
    counted from the right."""
    ls, rs = (args[0].shape, args[1].shape) if len(args) == 2 else (None, None)
    if ls is None or rs is None or len(ls) != len(rs):
        return []
    n = len(ls)
    found = []
    for a in sorted(axes):
        kl, kr = kind(args[0].type, args[0].ref, a), kind(args[1].type, args[1].ref, a)
        if not (isinstance(kl, Shard) and isinstance(kr, Shard)) or kl.dim == kr.dim \
                or -kl.dim > n or -kr.dim > n:
            continue
        if ls[kr.dim] == 1 and rs[kl.dim] == 1 and ls[kl.dim] != 1 and rs[kr.dim] != 1:
            found.append((a, kl.dim, kr.dim))
    return found


def diagonal_block(axis: str, dims: tuple[int, int], op: str) -> Exception:
    """SPMD216: a product whose two operands are sharded over `axis` along dims that stay apart
    in the result (`dims`: the left operand's, the right one's), reaching an output computed
    from that block alone."""
    left, right = dims
    return fail("SPMD216", op, f"the left operand is sharded over {axis!r} along its dim {left} "
                f"and the right one along its dim {right}, and both dims stay in the result: "
                f"each device computes only the diagonal block (its rows against its own "
                f"columns, e.g. its queries against its own keys), and an output is computed "
                f"from that block alone", axis, None,
                fix=f"all_gather the right operand over {axis!r} first (st.all_gather(k, "
                    f"{axis!r}, axis=d, tiled=True)) or bring its other blocks in by a ring of "
                    f"ppermutes and combine them; with st.allow('SPMD216') where a block-local "
                    f"product is meant (chunked local attention)")

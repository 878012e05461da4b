"""hijax types' specs (`jax.experimental.hijax.HiPspec`) pass through the drop-in.

`jax.shard_map` accepts a hijax type's own spec object as an in_spec / out_spec leaf (JAX's
`tests/hijax_test.py`: `test_tuple_shmap`, `test_shmap_grad_hitype`). `typed_shard_map`
refused it (SPMD509: "in_specs must be a PartitionSpec"), and with that fixed the engine's
boundary check crashed on it. Now such a spec is JAX's to check, and the engine does not walk
that shard_map: no rule reads a hijax type (a gap of the walk, listed with its reason).
`st.shard_map`, whose typed values are arrays, refuses such a spec with SPMD509 and names the
drop-in. Measured by running jax 0.10.2's own hijax_test.py through `typed_shard_map`: 108
passed, as raw (closing note, issue 27).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.hijax import HiPspec
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import UsageError
from spmdtyped._engine.check import check_shard_map, shard_map_eqn
from spmdtyped._validate import spec_tree


@dataclasses.dataclass(frozen=True)
class PairSpec(HiPspec):
    """A hijax pair type's spec, as JAX's hijax_test writes one (`TupP`)."""

    val: tuple

    def to_lo(self):
        return self.val


def test_a_hijax_spec_is_a_spec_leaf_of_the_drop_in_only():
    spec_tree(PairSpec((P("dp"), P())), "typed_shard_map", "in_specs", hijax=True)
    spec_tree((PairSpec((P("dp"), P())), P("tp")), "typed_shard_map", "out_specs", hijax=True)
    with pytest.raises(UsageError, match="must be a PartitionSpec"):   # still checked
        spec_tree(("dp",), "typed_shard_map", "in_specs", hijax=True)
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    with pytest.raises(UsageError, match="typed_shard_map") as got:
        st.shard_map(lambda t: t, mesh=mesh, in_specs=PairSpec((P("dp"), P())), out_specs=P())
    assert got.value.code == "SPMD509"


def test_the_engine_leaves_a_hijax_shard_map_to_jax():
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    # a staged shard_map, its in_specs made a hijax type's (as JAX stages one of hijax values)
    closed = jax.make_jaxpr(jax.shard_map(lambda x: jax.lax.psum(x + 1.0, "tp") * 2.0, mesh=mesh,
                                          in_specs=P("dp", "tp"), out_specs=P("dp")))(
        jnp.ones((8, 8)))
    eqn = shard_map_eqn(closed)
    hi = eqn.replace(params={**eqn.params, "in_specs": (PairSpec((P("dp", "tp"),)),)})
    got = check_shard_map(hi, manual=("dp", "tp"), mesh=mesh, source=None, where="typed")
    assert got.violations == []
    assert [m.split(": ", 1)[1].split(":")[0] for m in got.walk.mismatches] == [
        "a hijax type's spec (`jax.experimental.hijax.HiPspec`)"]
    # the same program of arrays is walked with nothing left out
    assert check_shard_map(eqn, manual=("dp", "tp"), mesh=mesh, source=None,
                           where="typed").walk.mismatches == []

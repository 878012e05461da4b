# legs: plugin mypy pyright stub
"""The plugin-free spelling: `Varying[Literal["dp"]]` and the canonical `SArray[...]`.

Clean under plain mypy and pyright (collectives return `SArray[Any, Any, Any]` there) and
under mypy with the plugin (where they are precise and still fit the annotations).
"""

from typing import Any, Literal, Never

import jax

import spmdtyped as st
from spmdtyped import Invariant, Reduced, SArray, Unreduced, Varying

DPTP = SArray[Literal["dp", "tp"], Never, Never]


def layer(x: Varying[Literal["dp"]], w: Varying[Literal["tp"]]) -> Varying[Literal["dp"]]:
    h: DPTP = x @ w
    return st.psum(h, "tp")


def zero(w_shard: Varying[Literal["dp"]]) -> Reduced[Literal["dp"]]:
    return st.all_gather(w_shard, "dp", to="reduced")


def mixed(x: SArray[Literal["dp"], Never, Literal["tp"]]) -> Varying[Literal["dp"]]:
    return st.psum(st.pcast(x, "tp", to="varying"), "tp")


def covariant(c: Invariant) -> Varying[Literal["dp"]]:
    return c  # Invariant is accepted where Varying is expected (JAX's implicit pvary)


def subset(x: Varying[Literal["tp"]]) -> Varying[Literal["dp", "tp"]]:
    return x


def partial_sums(u: Unreduced[Literal["tp"]]) -> Invariant:
    scaled: Unreduced[Literal["tp"]] = u * 0.5
    return st.psum(scaled, "tp")


def half_ported(raw: jax.Array, x: Varying[Literal["dp"]]) -> Any:
    # raw JAX values are accepted everywhere; their state is unknown statically
    y = st.psum(raw, "dp")
    z = x + raw
    return st.unwrap(y), z.shape, z.dtype, st.axis_size("dp")


def jaxtyping_hint(x: st.Float[Varying[Literal["dp"]], "batch/dp d"]) -> Varying[Literal["dp"]]:
    # statically `Annotated[Varying[...], "batch/dp d"]`: shapes are checked at runtime
    return x

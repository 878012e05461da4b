"""The user's frame of an equation's Python stack (`_frames` classifies the frames): the
innermost frame outside JAX, jaxlib, spmdtyped and the standard library is where an
equation's violation is reported; both walks and the report ask it of every equation they
locate, so it is read once per stack."""

from __future__ import annotations

from collections.abc import Sequence

from .._frames import called_jax_function, innermost_user
from .refine_facts import ByIdentity


def user_frame(frames: Sequence[tuple[str, int, str]]) -> tuple[str, int] | None:
    """The innermost frame outside JAX, spmdtyped and the standard library."""
    # an equation's frames are one tuple per traceback (`_compat.eqn_frames`): every walk of
    # the program asks for each equation's
    return _user_frame(frames) if isinstance(frames, tuple) else innermost_user(frames)


_user_frame = ByIdentity(innermost_user)


def primitive_detail(name: str, frames: Sequence[tuple[str, int, str]]) -> str:
    """The detail that names a violation's equation: its primitive, and the JAX function the
    user's line called when that is another name (`sign`, a step of `jax.nn.logsumexp`)."""
    fn = called_jax_function(frames)
    return f"primitive: {name}" if fn is None or fn == name else \
        f"primitive: {name}, a step of JAX's {fn}"

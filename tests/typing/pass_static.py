# legs: mypy pyright
"""Without the plugin: every operator form of a typed value is typed `SArray[Any, Any, Any]`
(no false error, and no `bool` that loses the state: `st.axis_index("tp") == 0` is an array),
and `x.at[idx].op(v)` exists."""

from typing import Any, Literal, assert_type

import spmdtyped as st
from spmdtyped import SArray, Varying

Arr = SArray[Any, Any, Any]


def forms(x: Varying[Literal["dp"]], w: Varying[Literal["tp"]]) -> None:
    assert_type(st.axis_index("tp") == 0, Arr)
    assert_type(x != w, Arr)
    assert_type(x % 2, Arr)
    assert_type(3 % x, Arr)
    assert_type(x // w, Arr)
    assert_type(2.0 // x, Arr)
    assert_type(x & w, Arr)
    assert_type(x | 1, Arr)
    assert_type(True ^ x, Arr)
    assert_type(~x, Arr)
    assert_type(x.at[0].set(1.0), Arr)
    assert_type(x.at[1:].add(w), Arr)
    assert_type(x.at[0].multiply(2.0), Arr)
    assert_type(x.at[0].min(w), Arr)
    assert_type(x.at[0].max(w), Arr)

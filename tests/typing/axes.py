"""The axis vocabulary of the typing tests: each mesh axis declared once.

With these aliases in scope, `Varying["dp"]` is standard typing (a forward reference to the
alias `dp`), so plain mypy, pyright and ruff accept it, and a misspelled axis is an error.
"""

from typing import Literal, TypeAlias

dp: TypeAlias = Literal["dp"]
tp: TypeAlias = Literal["tp"]

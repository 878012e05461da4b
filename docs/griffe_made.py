"""Griffe extension (mkdocs.yml): functions spmdtyped makes from its tables at import time
(`st.psum` ... `st.pcast` and `spmdtyped.lax`'s drop-ins, made from the collective table)
are invisible to static analysis; this documents them from the imported module instead."""

from __future__ import annotations

import importlib
from typing import Any

import griffe

#: modules whose public functions are made at import
MODULES = ("spmdtyped._ops.collectives", "spmdtyped.lax")


class MadeFunctions(griffe.Extension):
    def on_module(self, *, mod: griffe.Module, **kwargs: Any) -> None:
        if mod.path not in MODULES:
            return
        names = [n for n in getattr(importlib.import_module(mod.path), "__all__", ())
                 if n not in mod.members]
        if not names:
            return
        live = griffe.inspect(mod.path, docstring_parser=mod.docstring.parser if mod.docstring
                              else None)
        for name in names:
            if name in live.members:
                member = live.members[name]
                mod.set_member(name, member)

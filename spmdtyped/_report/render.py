"""The report for people: a terminal table (grouped by mesh axes, sorted by bytes) and a
self-contained HTML page with bar charts (bytes per axis, per source line). Plain text; no
plotting library needed."""

from __future__ import annotations

import html as _html
import os
from typing import Any


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _short(where: str | None) -> str:
    if not where:
        return "?"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def rows(rep: Any) -> list[dict[str, Any]]:
    """The traced collectives merged per (axes, kind, phase, origin, line), bytes first."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for c in rep.collectives:
        key = ("+".join(c.axes), c.kind, c.phase, c.origin, c.where)
        r = merged.setdefault(key, {"axes": key[0], "kind": c.kind, "phase": c.phase,
                                    "origin": c.origin, "where": c.where, "count": 0,
                                    "bytes": 0, "wire": 0.0})
        r["count"] += c.count
        r["bytes"] += c.bytes
        r["wire"] += rep.wire_bytes(c)
    return sorted(merged.values(), key=lambda r: (r["axes"], -r["bytes"]))


def table(rep: Any, width: int = 100) -> str:
    mesh = ", ".join(f"{a}={n}" for a, n in rep.mesh.items()) or "?"
    out = [f"communication per step and per device (mesh {mesh})"]
    head = f"  {'kind':<19}{'phase':<9}{'origin':<9}{'count':>6}{'bytes':>12}{'wire':>12}  where"
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows(rep):
        groups.setdefault(r["axes"], []).append(r)
    order = sorted(groups, key=lambda a: -sum(r["bytes"] for r in groups[a]))
    for axes in order:
        total = sum(r["bytes"] for r in groups[axes])
        out.append(f"\naxes {axes}: {fmt_bytes(total)}")
        out.append(head)
        for r in groups[axes]:
            out.append(f"  {r['kind']:<19}{r['phase']:<9}{r['origin']:<9}{r['count']:>6}"
                       f"{fmt_bytes(r['bytes']):>12}{fmt_bytes(r['wire']):>12}  "
                       f"{_short(r['where'])}"[:width])
    if not rep.collectives:
        out.append("  no collectives")
    kinds = rep.totals()["kinds"]
    out.append("\ntotal: " + (", ".join(f"{k} {fmt_bytes(b)}" for k, b in sorted(kinds.items()))
                              or "0 B"))
    if rep.was_compiled:
        comp = rep.totals("compiled")["kinds"]
        out.append("compiled: " + (", ".join(f"{k} {fmt_bytes(b)}"
                                             for k, b in sorted(comp.items())) or "0 B"))
        out.extend(f"  {d}" for d in rep.differences())
    for w in rep.unknown_trips:
        out.append(f"note: a while loop at {_short(w)} has no readable trip count "
                   "(its collectives are counted once)")
    if rep.flags:
        out.append("\nflags:")
        for f in rep.flags:
            out.append(f"  {f.code} {_short(f.where)}: {f.message}")
            out.append(f"      fix: {f.fix}")
    return "\n".join(out)


def _bars(title: str, items: list[tuple[str, float]]) -> str:
    top = max((v for _, v in items), default=0) or 1
    body = "".join(
        f'<div class="row"><span class="lab">{_html.escape(k)}</span>'
        f'<span class="bar" style="width:{max(v / top * 60, 0.5):.1f}%"></span>'
        f'<span class="val">{fmt_bytes(v)}</span></div>' for k, v in items)
    return f"<h2>{_html.escape(title)}</h2>{body}"


def html(rep: Any) -> str:
    per_axis = sorted(rep.totals()["axes"].items(), key=lambda kv: -kv[1])
    per_line: dict[str, float] = {}
    for r in rows(rep):
        k = f"{_short(r['where'])} {r['kind']} ({r['axes']}, {r['phase']})"
        per_line[k] = per_line.get(k, 0) + r["bytes"]
    lines = sorted(per_line.items(), key=lambda kv: -kv[1])[:40]
    style = ("body{font-family:sans-serif;max-width:60em}.row{display:flex;align-items:center;"
             "margin:2px 0}.lab{width:24em;font-size:12px;overflow:hidden;white-space:nowrap}"
             ".bar{background:#4a7bd0;height:12px;display:inline-block}"
             ".val{margin-left:6px;font-size:12px}pre{font-size:11px}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>communication report"
            f"</title><style>{style}</style></head><body><h1>communication report</h1>"
            + _bars("bytes per step per device, by mesh axes", per_axis)
            + _bars("bytes per step per device, by source line", lines)
            + f"<pre>{_html.escape(table(rep))}</pre></body></html>")

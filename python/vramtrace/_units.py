"""Sizes and tables for people, as the binary writes them (collector/src/names/units.rs `bytes`: two decimals in the
largest unit that fits, rounded half up)."""

import html
from typing import Iterable, List, Sequence

_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def size(b: int) -> str:
    for unit, name in _UNITS:
        if b >= unit:
            hundredths = (b * 100 + unit // 2) // unit
            return "%d.%02d %s" % (hundredths // 100, hundredths % 100, name)
    return "%d B" % b


def table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int] = ()) -> str:
    """Columns two spaces apart; the columns in `right` aligned right (figures)."""
    rows = [list(head)] + [list(r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines: List[str] = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def html_table(head: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[int] = ()) -> str:
    def cell(tag: str, i: int, c: str) -> str:
        style = ' style="text-align:right"' if i in right else ' style="text-align:left"'
        return "<%s%s>%s</%s>" % (tag, style, html.escape(c), tag)

    out = ["<table><thead><tr>", "".join(cell("th", i, c) for i, c in enumerate(head)), "</tr></thead><tbody>"]
    for r in rows:
        out.append("<tr>%s</tr>" % "".join(cell("td", i, c) for i, c in enumerate(r)))
    out.append("</tbody></table>")
    return "".join(out)

"""HTML building blocks shared by the HTML report's modules: escaping, tables, axis units. No computation."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape

from gpudoctor.report import _fmt as f


def e(text: object) -> str:
    """Escaped text; control characters shown as visible escapes (``_fmt.markup``, as the SVG charts)."""
    return f.markup(text)


def e1(text: object) -> str:
    """Escaped text on one line."""
    return escape(f.one_line(text), quote=True)


def rich(text: object) -> str:
    """Escaped text on one line; `backtick` pairs become <code>."""
    return "".join(
        f"<code>{escape(part, quote=True)}</code>" if is_code else escape(part, quote=True) for is_code, part in f.code_parts(text)
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], numeric: Sequence[int] = ()) -> str:
    """A table; header and cells must already be escaped HTML."""
    num = set(numeric)
    th = "".join(f'<th class="n">{h}</th>' if i in num else f"<th>{h}</th>" for i, h in enumerate(header))
    body = []
    for r in rows:
        body.append("<tr>" + "".join(f'<td class="n">{c}</td>' if i in num else f"<td>{c}</td>" for i, c in enumerate(r)) + "</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def tick(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}"


def time_scale(max_ns: float) -> tuple[float, str]:
    """The unit an axis of durations up to ``max_ns`` reads best in: (ns per unit, unit)."""
    for scale, unit in ((6e10, "min"), (1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if max_ns >= (10 * scale if unit == "min" else scale):
            return scale, unit
    return 1.0, "ns"


def time_fmt(unit: str):
    return lambda v: f"{tick(v)} {unit}"

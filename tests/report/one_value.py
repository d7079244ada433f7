"""One quantity, one value: find every place a report (in every format) and the stderr line of
``gpudoctor profile`` print a named quantity, and the values they print.

``QUANTITIES`` names each quantity a reader can see in more than one place and the phrases that
print it; :func:`values_by_quantity` collects what every text says, and :func:`conflicts` lists
the quantities printed with two different values (printed precision allowed for: "111.30 ms" and
"111.3 ms" are one value, "3.30 s" and "3.37 s" are two).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable

from gpudoctor.model import Report
from gpudoctor.report import FORMATS, render

_NUM = r"(\d[\d,]*(?:\.\d+)?)"
_DUR = _NUM + r" ?(ns|µs|us|ms|s|min)\b"
_PCT = _NUM + r" ?%"
_SEP = r"[ \t:|]+"  # between a label and its value, on one line: "label  8", "label: 8", "| label | 8 |"
_SCALE_NS = {"ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9, "min": 60e9, "%": 1.0, "": 1.0}

# quantity -> the phrases that print it (each regex captures the number and, for a time, its unit)
QUANTITIES: dict[str, tuple[str, ...]] = {
    # THE step time: the mean over the unprofiled steady steps (analysis.figures), wherever a text says what the
    # step takes now; the median and p90 are its spread, printed only under their own names
    "step time (now)": (
        r"(?:^|\|)[ \t]*step time" + _SEP + _DUR,  # a summary row (not "expected step time", another quantity)
        r"step time " + _DUR + r" \(mean\)",
        r"\bnow " + _DUR + r" per step\b",
        r"of an? " + _DUR + r" (?:optimizer )?step, means over",
        r"(?<!profiled )\bstep mean time" + _SEP + _DUR,
        r"\bagainst " + _DUR + r" now(?! \(per batch)",  # a model's step now (GD201's, GD104's), not one per batch
    ),
    "step time, median": (
        r"step time, median \(spread\)" + _SEP + _DUR,
        r"\(mean\), median " + _DUR,
        r"(?<!profiled )\bstep median time" + _SEP + _DUR,  # not the profiled steps' own median
    ),
    "step time, p90": (
        r"step time, p90 \(spread\)" + _SEP + _DUR,
        r"\bp90 " + _DUR,
    ),
    "waiting for data (every steady step)": (
        r"waiting for data" + _SEP + _PCT,
        r"\bthe loop waits " + _PCT + r" of step time for the next batch",
        r"\b" + _PCT + r" of step time waiting for data",
        r"\bdata wait share" + _SEP + _PCT,
    ),
    "training process CPU": (
        r"training process CPU \(median\)" + _SEP + _PCT,
        r"training process at " + _PCT + r" of one core",
        r"training process runs at " + _PCT + r" CPU",
        r"the process at " + _PCT + r" CPU",
        r"the process's CPU \(" + _PCT + r"\)",
        r"\bmain CPU share" + _SEP + _PCT,
    ),
    "GPU idle (step windows)": (
        r"GPU idle" + _SEP + _PCT,
        r"GPU idle " + _PCT + r" of step time",
        r"\bGPU idle share" + _SEP + _PCT,
    ),
    "peak GPU memory": (
        r"peak GPU memory" + _SEP + _PCT,
    ),
    "CPU cores": (
        r"CPU cores" + _SEP + _NUM + r"\b(?![.%])",
        r"\bCPU count" + _SEP + _NUM + r"\b(?![.%])",
    ),
    "steps recorded": (
        r"steps recorded" + _SEP + _NUM + r"\b(?![.%])",
        r"^gpudoctor: " + _NUM + r" steps \(",
    ),
}


def _strings(data: object) -> Iterable[str]:
    """Every string in a JSON document, and each summary row or metric as "label: value unit"."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, list):
        for x in data:
            yield from _strings(x)
    elif isinstance(data, dict):
        if "label" in data and "value" in data and "unit" in data and isinstance(data["value"], (int, float)):
            yield f"{data['label']}: {data['value']} {data['unit']}"  # a summary row
        for v in data.values():
            yield from _strings(v)


def texts(report: Report) -> dict[str, str]:
    """The report in every format, as the text a reader reads: tags and escapes gone, a JSON
    document's strings and summary rows one per line."""
    out: dict[str, str] = {}
    for fmt in FORMATS:
        body = render(report, fmt)
        if fmt == "html":
            body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
            # a summary card shows its figure above its label: one line, label first, as elsewhere
            body = re.sub(r'<div class="card"><div class="v">(.*?)</div><div class="k">(.*?)( \(of [^<]*\))?</div></div>',
                          r"\n\2: \1\3\n", body)
            body = re.sub(r"<br\s*/?>|</(?:div|p|li|tr|h\d|pre|table)>", "\n", body)
            body = html.unescape(re.sub(r"<[^>]+>", " ", body))
        elif fmt == "md":
            body = body.replace("\\", "")
        elif fmt in ("json", "sarif"):
            body = "\n".join(_strings(json.loads(body)))
        out[fmt] = re.sub(r"\x1b\[[0-9;]*m", "", body)
    return out


def _value(number: str, unit: str) -> tuple[float, float]:
    """(value in the unit's base, half of its last printed digit in the same base)."""
    digits = len(number.split(".")[1]) if "." in number else 0
    scale = _SCALE_NS.get(unit, 1.0)
    return float(number.replace(",", "")) * scale, 0.5 * 10 ** -digits * scale


def values_by_quantity(named_texts: dict[str, str]) -> dict[str, list[tuple[str, str, str]]]:
    """quantity -> every (where, printed value, the text around it) the texts print it."""
    found: dict[str, list[tuple[str, str, str]]] = {}
    for quantity, patterns in QUANTITIES.items():
        for where, body in named_texts.items():
            for pattern in patterns:
                for m in re.finditer(pattern, body, flags=re.M):
                    unit = m.group(2) if m.lastindex and m.lastindex >= 2 else ("%" if "%" in pattern else "")
                    around = body[max(0, m.start() - 40): m.end() + 20].replace("\n", " ")
                    found.setdefault(quantity, []).append((where, f"{m.group(1)} {unit}".strip(), around))
    return found


def conflicts(named_texts: dict[str, str]) -> list[str]:
    """The quantities printed with two values that no rounding of one explains, in words."""
    out = []
    for quantity, seen in values_by_quantity(named_texts).items():
        parsed = []
        for where, printed, around in seen:
            number, _, unit = printed.partition(" ")
            value, half = _value(number, unit)
            parsed.append((value, half, where, printed, around))
        for i, (a, ha, wa, pa, ca) in enumerate(parsed):
            for b, hb, wb, pb, cb in parsed[i + 1:]:
                if abs(a - b) > ha + hb + 1e-9 * max(abs(a), abs(b), 1.0):
                    out.append(f"{quantity}: {pa} in {wa} ({ca!r}) but {pb} in {wb} ({cb!r})")
                    break
            else:
                continue
            break
    return out

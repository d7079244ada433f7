"""Units shared by the rules' messages, the renderers, ``compare`` and the stderr summary, so
that one quantity reads the same everywhere: bytes in binary units only (``512 B``, ``3.20 MiB``,
``2.15 GiB``; never GB for a size: GB/s is a bandwidth, 1e9 bytes per second), durations as
``12.3 µs``, ``45.6 ms``, ``1.23 s``, shares as ``38.0%``.

The one place a value becomes text: ``rules.formatting.fmt_ns``/``fmt_bytes``/``fmt_pct`` and
``report._fmt.duration``/``size``/``pct`` are these functions.
"""

from __future__ import annotations

import math


def size_text(n: float | int | None, missing: str = "n/a") -> str:
    """Bytes in binary units: ``512 B``, ``3.20 MiB``, ``1.50 GiB`` (three significant digits)."""
    if n is None:
        return missing
    a = abs(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if a >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if abs(v) < 10 else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def duration_text(ns: float | int | None, missing: str = "n/a", *, precise: bool = False) -> str:
    """Nanoseconds as ``850 ns``, ``12.3 µs``, ``45.6 ms``, ``1.23 s`` or ``1.5 min`` (the reports,
    the stderr summary). ``precise``: milliseconds to two decimals and no minutes (``4.56 ms``,
    ``754.20 s``), as a rule's message states the figure it judged."""
    if ns is None:
        return missing
    if not math.isfinite(ns):
        return "n/a"
    a = abs(ns)
    if a < 1_000:
        return f"{ns:.0f} ns"
    if a < 1_000_000:
        return f"{ns / 1e3:.1f} µs"
    if a < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms" if precise else f"{ns / 1e6:.1f} ms"
    if precise or a < 600_000_000_000:
        return f"{ns / 1e9:.2f} s"
    return f"{ns / 6e10:.1f} min"


def pct_text(value: float | int | None, missing: str = "n/a", digits: int = 1) -> str:
    """A share as ``38.0%`` (``digits`` decimals)."""
    if value is None:
        return missing
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}f}%"

"""Units shared by the rules' messages and the renderers, so that one size reads the same
everywhere: bytes in binary units (``512 B``, ``3.20 MiB``, ``2.15 GiB``)."""

from __future__ import annotations


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

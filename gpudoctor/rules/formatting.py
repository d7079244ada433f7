"""How a rule's message prints a figure or points at a call site (the text itself: ``gpudoctor.model.units``)."""

from __future__ import annotations

from gpudoctor.model.findings import Location
from gpudoctor.model.run import CallSite
from gpudoctor.model.units import duration_text, pct_text, size_text


def fmt_ns(ns: float | int | None) -> str:
    """A duration for a message: 850 ns, 12.3 µs, 4.56 ms, 1.23 s (``gpudoctor.model.units``)."""
    return duration_text(ns, "?", precise=True)


def fmt_bytes(n: float | int | None) -> str:
    """Bytes in binary units, as every report prints them (``gpudoctor.model.units``)."""
    return size_text(n, missing="?")


def fmt_pct(p: float | None) -> str:
    """A share for a message: 38.0% (``gpudoctor.model.units``)."""
    return pct_text(p, "?")


def location_of(site: CallSite | None) -> Location | None:
    """The location of a finding at a setting's call site (None: the site is not recorded)."""
    return None if site is None else Location(file=site.file, line=site.line, function=site.function)

"""What cProfile recorded of the user's code: the user's own functions, and how a finding names an entry
(used by the DataLoader's load, ``analysis.loader``, and by the rules through ``rules.profiles``)."""

from __future__ import annotations

from gpudoctor.model.run import PstatsEntry

__all__ = ["entry_name", "user_functions"]

_LIBRARY_MARKERS = ("site-packages", "dist-packages", "/lib/python", "\\lib\\python", "<frozen", "gpudoctor")


def user_functions(entries: tuple[PstatsEntry, ...]) -> list[PstatsEntry]:
    """The user's own functions of a cProfile, by self time (no library, built-in or gpudoctor code)."""
    out = [
        e
        for e in entries
        if e.file
        and not e.file.startswith("~")
        and not e.file.startswith("<")
        and not any(marker in e.file for marker in _LIBRARY_MARKERS)
    ]
    out.sort(key=lambda e: (-e.tottime_s, e.file, e.line))
    return out


def entry_name(e: PstatsEntry) -> str:
    """How a finding names a cProfile entry: ``file:line(function)``, or the built-in's name."""
    if e.file.startswith("~") or not e.line:
        return e.function.strip("<>").replace("built-in method ", "")
    return f"{e.file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{e.line}({e.function})"

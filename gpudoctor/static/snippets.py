"""The before/after of ``gpudoctor check``'s findings, from the checked files themselves.

A static check says what its fix changes (``Fix.edits``, built with ``gpudoctor.rules.edits``);
here the rewrite engine makes that change on the file as it is read (or as ``--fix`` /
``--diff`` has rewritten it so far) and the finding shows the statement before and after,
exactly what ``gpudoctor check --fix`` writes. ``Fix.automatic`` says whether ``--fix``
makes it: its rule declares its edits mechanical and safe (``Rule.autofix``) and the engine
could make this one. An edit the engine refuses keeps the check's own before/after (quoted
from the source) and says why in the evidence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace

from gpudoctor.model.findings import Evidence, Finding, Fix, Location
from gpudoctor.rules.edits import FIX_LEFT
from gpudoctor.rules.registry import get


def with_source(finding: Finding, path: str, text_of: Callable[[str], str | None],
                fix_location: Location | None = None) -> Finding:
    """``finding`` with its before/after made from the file at ``path`` (absolute), where its fix is:
    at ``fix_location`` when it is not at the finding's location (GD301: the copy, its DataLoader's fix)."""
    fix = finding.fix
    loc = fix_location or finding.location
    if not fix.edits:
        # the static checks quote the script's own lines (a snippet of several lines may elide with "..."),
        # not always those at the finding's line (GD204: the worker_init_fn's): the quote is found in the file
        text = text_of(path) if fix.before and loc is not None else None
        where = _quoted_at(text, fix.before, loc) if text is not None and loc is not None else None
        why = "" if where is not None else (fix.illustration or "the check's own example, not a quote of the file")
        return replace(finding, fix=replace(fix, source=where, illustration=why if fix.before else ""))
    text = text_of(path)
    if text is None:
        return replace(finding, fix=replace(fix, source=loc if fix.before else None, automatic=False))
    from gpudoctor.rewrite import RewriteError, snippet

    try:
        cut = snippet(text, fix.edits)
    except RewriteError as err:
        note = f"{FIX_LEFT}: {err}"
        evidence = replace(finding.evidence, notes=(*finding.evidence.notes, note))
        return replace(finding, evidence=evidence,
                       fix=replace(fix, source=loc if fix.before else None, automatic=False))
    where = Location(loc.file, cut.line) if loc is not None else None
    automatic = get(finding.code).autofix
    return replace(finding, fix=Fix(fix.instruction, cut.before, cut.after, fix.edits, where, "", automatic))


def note_refused(evidence: Evidence, reason: str) -> Evidence:
    return replace(evidence, notes=(*evidence.notes, f"{FIX_LEFT}: {reason}"))


def _quoted_at(text: str, before: str, loc: Location) -> Location | None:
    """Where ``before``'s first line is in ``text``: at the finding's line, else its one other place."""
    first = before.splitlines()[0].strip() if before.strip() else ""
    if not first:
        return None
    lines, where = _stripped_lines(text)
    if 0 < loc.line <= len(lines) and lines[loc.line - 1] == first:
        return loc
    found = where.get(first, ())
    return Location(loc.file, found[0]) if len(found) == 1 else None


@functools.lru_cache(maxsize=4)
def _stripped_lines(text: str) -> tuple[list[str], dict[str, list[int]]]:
    """``text``'s lines stripped, and the line numbers of each: made once per file (a file's findings each
    look their quote up; splitting the file for each was quadratic in its size). A str caches its hash."""
    lines = [x.strip() for x in text.splitlines()]
    where: dict[str, list[int]] = {}
    for i, x in enumerate(lines, 1):
        where.setdefault(x, []).append(i)
    return lines, where

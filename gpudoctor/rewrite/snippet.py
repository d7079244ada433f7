"""A fix's before/after, cut from the user's own file: the statement an edit changes, as the file has
it, and the same lines after the edit.

The edit is made on the whole file (``engine.apply``), so that the after is exactly what
``gpudoctor check --fix`` would write; the lines shown are those of the statement it
changes (a compound statement's header when the change is in its header), mapped to the
new text through a line diff. Both are dedented by the statement's own indentation. A
loop put under ``with …:`` is shown by its first lines and ``...``.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from gpudoctor.model.findings import Edit
from gpudoctor.rewrite.engine import apply
from gpudoctor.rewrite.text import RewriteError

#: A wrapped statement longer than this is shown by its first ``_KEEP_LINES`` lines and ``...``.
MAX_LINES = 6
_KEEP_LINES = 4


@dataclass(frozen=True, slots=True)
class Snippet:
    before: str  # the statement as the file has it (dedented)
    after: str  # the same statement with the edits made
    line: int  # the file's line of the first line of ``before``


def _map(opcodes: list[tuple[str, int, int, int, int]], first: int, end: int) -> tuple[int, int]:
    """Old lines [first, end) (0-based) as new lines, with lines inserted right before or after them."""
    new_first = new_end = None
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "insert" and i1 == first and new_first is None:
            new_first = j1
        if i1 <= first < i2 and new_first is None:
            new_first = j1 + (first - i1) if tag == "equal" else j1
        if i1 <= end - 1 < i2:
            new_end = j1 + (end - i1) if tag == "equal" else j2
        if tag == "insert" and i1 == end and new_end is not None:
            new_end = j2
    if new_first is None:
        new_first = next((j1 for tag, i1, _i2, j1, _j2 in opcodes if i1 >= first), 0)
    if new_end is None:
        new_end = new_first
    return new_first, max(new_end, new_first)


def _dedent(lines: list[str], prefix: str) -> list[str]:
    return [x[len(prefix):] if x.startswith(prefix) else x.lstrip() for x in lines]


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def snippet(text: str, edits: Sequence[Edit]) -> Snippet:
    """The before/after of ``edits`` (one finding's) in ``text``; RewriteError with the reason when one
    of them cannot be made."""
    applied = apply(text, edits)
    if applied.skipped:
        raise RewriteError(applied.skipped[0][1])
    first = min(s for _e, s, _l in applied.spans)
    last = max(e for _e, _s, e in applied.spans)
    old = text.splitlines()
    new = applied.text.splitlines()
    ops = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
    j1, j2 = _map(ops, first - 1, last)
    before, after = old[first - 1:last], new[j1:j2]
    prefix = _indent_of(before[0]) if before else ""
    before, after = _dedent(before, prefix), _dedent(after, prefix)
    if len(before) > MAX_LINES and any(e.kind == "wrap" for e in edits):
        extra = max(0, len(after) - len(before))
        before = before[:_KEEP_LINES] + [_indent_of(before[_KEEP_LINES - 1]) + "..."]
        after = after[:_KEEP_LINES + extra] + [_indent_of(after[_KEEP_LINES + extra - 1]) + "..."]
    return Snippet("\n".join(before), "\n".join(after), first if before else max(1, first))

"""A fix's before/after, cut from the user's own file: the statement an edit changes, as the file has
it, and the same lines after the edit.

The edit is made on the whole file (``engine.apply``), so that the after is exactly what
``gpudoctor check --fix`` would write; the lines shown are those of the statement it
changes (a compound statement's header when the change is in its header), mapped to the
new text through a line diff. Both are dedented by the statement's own indentation. A
loop put under ``with …:`` is shown by its first lines and ``...``.

The edit is made on the statement it changes, not on the whole file: the statement is rendered
at its own indentation before and after the edit, and the cut is made there. The lines rendered
before the edit must be the file's own lines, or the whole file is rewritten as ``--fix`` does
(a decorated ``def``, an edit of several statements). A check cuts one snippet per finding,
so this keeps it linear in the file's size: rewriting the whole file for each finding made a
file of 8,000 small functions take minutes.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from gpudoctor.model.findings import Edit
from gpudoctor.rewrite.engine import Planned, apply, plan_edits
from gpudoctor.rewrite.parts import WORK, _import_anchor
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
    planned = plan_edits(text, edits)
    if planned.skipped:
        raise RewriteError(planned.skipped[0][1])
    if not planned.done:
        raise RewriteError("no edit to make")
    spans = planned.spans
    first = min(s for _e, s, _l in spans)
    last = max(e for _e, _s, e in spans)
    local = _local(planned)
    if local is not None:
        base, old, new = local
    else:  # the whole file, as --fix rewrites it
        base, old, new = 1, text.splitlines(), apply(text, edits).text.splitlines()
    ops = difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
    j1, j2 = _map(ops, first - base, last - base + 1)
    before, after = old[first - base:last - base + 1], new[j1:j2]
    prefix = _indent_of(before[0]) if before else ""
    before, after = _dedent(before, prefix), _dedent(after, prefix)
    if len(before) > MAX_LINES and any(e.kind == "wrap" for e in edits):
        extra = max(0, len(after) - len(before))
        before = before[:_KEEP_LINES] + [_indent_of(before[_KEEP_LINES - 1]) + "..."]
        after = after[:_KEEP_LINES + extra] + [_indent_of(after[_KEEP_LINES + extra - 1]) + "..."]
    return Snippet("\n".join(before), "\n".join(after), first if before else max(1, first))


def _local(planned: Planned) -> tuple[int, list[str], list[str]] | None:
    """The statement the edits change, rendered before and after them: (its first line in the file, the
    lines before, the lines after); None when that cannot be cut from the statement alone."""
    if len(planned.parts) != 1:
        return None
    (part,) = planned.parts.values()
    ix = part.ix
    t = part.transformer(planned.source)
    kinds = {e.kind for e in planned.done}
    if "insert" in kinds:
        if kinds != {"insert"}:
            return None
        code = "".join(ix.module.code_for_node(s) for s in t.added())
        WORK.rendered_bytes += len(code)
        added = code.splitlines()
        anchor = _import_anchor(ix.module)
        if anchor < 0:
            return 1, [], added
        stmt = ix.module.body[anchor]
        old = _rendered(ix, stmt, stmt)
        if not _is_source(ix, stmt, old):
            return None
        return ix.range(stmt).start.line + ix.offset, old, old + added
    nodes = {id(node): node for _e, node, _whole in part.changes if node is not None}
    if len(nodes) != 1:
        return None
    (stmt,) = nodes.values()
    if getattr(stmt, "decorators", ()):
        return None  # its lines start at the decorators, its position at `def`
    if isinstance(stmt, cst.SimpleStatementLine):  # one line or more, each all its own: its lines in the file
        r = ix.range(stmt)
        old = ix.lines[r.start.line - 1:r.end.line]
    else:  # a compound statement renders the comments after its last line too (its blocks' footers)
        old = _rendered(ix, stmt, stmt)
        if not _is_source(ix, stmt, old):
            return None
    try:
        new_stmt = stmt.visit(t)
        wrap = part.plan.wraps.get(stmt)
        if wrap is not None:
            new_stmt = t.wrapped(new_stmt, wrap)
        new = _rendered(ix, stmt, new_stmt)
    except (cst.CSTValidationError, cst.ParserSyntaxError, ValueError) as err:
        raise RewriteError(f"the rewrite failed ({type(err).__name__}: {err}); nothing was changed") from None
    code = "\n".join(new) + "\n"
    try:
        ast.parse("if 1:\n" + code if new and new[0][:1].isspace() else code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise RewriteError(f"the rewritten statement would not parse ({err}); nothing was changed") from None
    return ix.range(stmt).start.line + ix.offset, old, new


def _rendered(ix, stmt: cst.CSTNode, node: cst.CSTNode) -> list[str]:  # noqa: ANN001 - engine._Index
    """``node`` (``stmt`` itself, or as the edits made it) rendered where ``stmt`` is in the file: at its
    indentation, without the comments above it. It is rendered inside as many blocks as hold ``stmt``,
    whose header lines are then dropped."""
    node = node.with_changes(leading_lines=())
    blocks = [a for a in ix.ancestors(stmt) if isinstance(a, cst.IndentedBlock)]
    for block in blocks:  # innermost first
        node = cst.If(test=cst.Name("_"), body=cst.IndentedBlock(body=[node], indent=block.indent))
    code = ix.module.code_for_node(node)
    WORK.rendered_bytes += len(code)
    return code.splitlines()[len(blocks):]


def _is_source(ix, stmt: cst.CSTNode, lines: list[str]) -> bool:  # noqa: ANN001 - engine._Index
    """Whether ``lines`` are the file's own, from the statement's first line on."""
    start = ix.range(stmt).start.line - 1
    return bool(lines) and ix.lines[start:start + len(lines)] == lines

"""A file's text as the rewrite engine reads it: a part at a time, each parsed by LibCST when an edit
falls in it, with its nodes' positions and parents (``_Index``).

A check cuts one before/after per finding and ``--fix`` rewrites every file with findings:
parsing and walking the whole file for each would make a check quadratic in the file's size
(8,000 small functions took 368 s). ``_Source`` splits a file into parts along its top-level
statements (Python's ``ast`` finds them), parses a part only when an edit falls in it, and
keeps the last ``MAX_PARTS``; the engine (``engine.py``) locates, checks and makes each edit
in its part, and splices the parts it changed back into the file. ``WORK`` counts what was
parsed, walked and rendered (the tests hold it linear; ``benchmarks/check_speed.py --scaling``
times it).
"""

from __future__ import annotations

import ast
import bisect
import io
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import libcst as cst
from libcst.metadata import CodePosition, CodeRange, MetadataWrapper, PositionProvider

from gpudoctor.rewrite.text import RewriteError


@dataclass(slots=True)
class Work:
    """What the engine has done since ``reset``: the tests hold it linear in the file's size."""

    parsed_bytes: int = 0  # source parsed by LibCST
    walked_nodes: int = 0  # nodes of those parses given positions and parents
    rendered_bytes: int = 0  # code rendered: the statements of the before/afters, the files --fix rewrites

    def reset(self) -> None:
        self.parsed_bytes = self.walked_nodes = self.rendered_bytes = 0


WORK = Work()
_EMPTY = cst.Module(body=[])


def code_of(node: cst.CSTNode) -> str:
    return _EMPTY.code_for_node(node)


def _callee(func: cst.BaseExpression) -> str:
    if isinstance(func, cst.Name):
        return func.value
    if isinstance(func, cst.Attribute):
        return func.attr.value
    return ""



# --------------------------------------------------------------------------- the index of a module


def _parse(text: str) -> cst.Module:
    try:
        return cst.parse_module(text)
    except cst.ParserSyntaxError as err:
        raise RewriteError(f"LibCST cannot parse it ({str(err).splitlines()[0]})") from None
    except RecursionError:
        raise RewriteError("it is nested too deeply to rewrite") from None


def _walk(module: cst.Module) -> tuple[Mapping[cst.CSTNode, CodeRange], dict[cst.CSTNode, cst.CSTNode],
                                       list[cst.Call], list[cst.CSTNode]]:
    """Every node's position (``PositionProvider``'s) and parent, the calls and the statements, in the
    file's order (a statement before those inside it).

    One rendering of the module does it all (``_Walk``): LibCST's own way, ``MetadataWrapper``, walks the
    tree three times (positions, an empty batch of visitors, then the walk for parents and nodes), and
    that walk is most of what a check of a large file costs. When LibCST's internals differ from what
    ``_Walk`` expects, its own way is taken."""
    try:
        try:
            return _Walk.run(module)
        except (AttributeError, TypeError, ImportError):  # pragma: no cover - another LibCST
            wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
            found = _Collect()
            module.visit(found)
            return wrapper.resolve(PositionProvider), found.parent, found.calls, found.statements
    except RecursionError:  # on 3.13 a chain that parses (5,000 `+`) can still be too deep for the codegen
        raise RewriteError("it is nested too deeply to rewrite") from None


_STATEMENT_TYPES = (cst.SimpleStatementLine, cst.For, cst.While, cst.If, cst.With, cst.Try, cst.FunctionDef,
                    cst.ClassDef)


class _Walk:
    """Positions as ``PositionProvider`` records them, and parents, while the module is rendered once.

    ``PositionProvidingCodegenState`` with its per-node hooks made lean (the position kept as a tuple until
    the node's range is made, a token without a line break not split): the same ranges, in less time."""

    _state: type | None = None

    def __init__(self) -> None:
        self._computed: dict[cst.CSTNode, CodeRange] = {}  # what PositionProvidingCodegenState fills
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self.stack: list[cst.CSTNode] = []
        self.starts: list[tuple[int, int]] = []
        self.calls: list[cst.Call] = []
        self.statements: list[cst.CSTNode] = []

    @classmethod
    def run(cls, module: cst.Module) -> tuple[dict, dict, list, list]:
        walk = cls()
        state = cls.state_class()(default_indent=module.default_indent, default_newline=module.default_newline,
                                  provider=walk)  # type: ignore[arg-type] - it keeps the positions in ``_computed``
        state.walk = walk
        module._codegen(state)
        return walk._computed, walk.parent, walk.calls, walk.statements

    @classmethod
    def state_class(cls) -> type:
        if cls._state is not None:
            return cls._state
        from libcst.metadata.position_provider import NEWLINE_RE, PositionProvidingCodegenState

        statement_types = frozenset(_STATEMENT_TYPES)
        position, code_range, call = CodePosition, CodeRange, cst.Call

        class State(PositionProvidingCodegenState):
            walk: _Walk

            def _update_position(self, value: str) -> None:
                if "\n" in value or "\r" in value:
                    segments = NEWLINE_RE.split(value)
                    self.line += len(segments) - 1
                    self.column = len(segments[-1])
                else:
                    self.column += len(value)

            def before_codegen(self, node: cst.CSTNode) -> None:
                walk = self.walk
                nodes = walk.stack
                if nodes:
                    walk.parent[node] = nodes[-1]
                nodes.append(node)
                walk.starts.append((self.line, self.column))
                kind = type(node)
                if kind is call:
                    walk.calls.append(node)
                elif kind in statement_types:
                    walk.statements.append(node)

            def after_codegen(self, node: cst.CSTNode) -> None:
                walk = self.walk
                line, column = walk.starts.pop()
                walk.stack.pop()
                if node not in walk._computed:  # a syntactic position (record_syntactic_position) is kept
                    walk._computed[node] = code_range(position(line, column), position(self.line, self.column))

        cls._state = State
        return State


class _Collect(cst.CSTVisitor):
    """One walk of the tree: every node's parent, the calls, the statements (in the file's order)."""

    def __init__(self) -> None:
        self.calls: list[cst.Call] = []
        self.statements: list[cst.CSTNode] = []
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parent[node] = self._stack[-1]
        self._stack.append(node)
        return super().on_visit(node)

    def on_leave(self, original_node: cst.CSTNode) -> None:
        super().on_leave(original_node)
        self._stack.pop()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self.statements.append(node)

    def visit_For(self, node: cst.For) -> None:
        self.statements.append(node)

    def visit_While(self, node: cst.While) -> None:
        self.statements.append(node)

    def visit_If(self, node: cst.If) -> None:
        self.statements.append(node)

    def visit_With(self, node: cst.With) -> None:
        self.statements.append(node)

    def visit_Try(self, node: cst.Try) -> None:
        self.statements.append(node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.statements.append(node)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.statements.append(node)


class _Index:
    """One parse of a part of the file (``_Source``: a top-level statement, or the whole file): its nodes
    with their positions and parents. Lines and positions are the part's own: ``offset`` lines of the
    file come before it."""

    def __init__(self, text: str, offset: int = 0, indent: str | None = None, newline: str | None = None) -> None:
        self.text = text
        self.offset = offset
        self._lines: list[str] | None = None
        module = _parse(text)
        if indent is not None and newline is not None and (module.default_indent, module.default_newline) != (
                indent, newline):
            # a part is parsed as the whole file would be: LibCST takes the default indent from the first
            # indented block (a block indented so keeps no indent of its own) and the newline from the first
            # line. A block first, in the file's indent and newline, gives the part the file's; it is dropped.
            module = _parse(f"if 1:{newline}{indent}pass{newline}{text}")
            module = module.with_changes(body=module.body[1:])
        self.module = module  # parsed here and never changed (a transform makes a new tree)
        self.pos, self.parent, self.calls, self.statements = _walk(module)
        WORK.parsed_bytes += len(text)
        WORK.walked_nodes += len(self.pos)
        # lookups by line, so that locating an edit does not scan the file (a check makes one per finding)
        self.calls_at: dict[tuple[str, int], list[cst.Call]] = defaultdict(list)  # (callee, first line)
        self.calls_named: dict[str, list[cst.Call]] = defaultdict(list)
        for c in self.calls:
            name = _callee(c.func)
            self.calls_named[name].append(c)
            self.calls_at[(name, self.pos[c].start.line)].append(c)
        self.statements_at: dict[int, list[cst.CSTNode]] = defaultdict(list)
        for st in self.statements:
            self.statements_at[self.pos[st].start.line].append(st)
        self.starts = [self.pos[st].start.line for st in self.statements]  # non-decreasing (pre-order)
        self._top_level: set[str] | None = None

    @property
    def lines(self) -> list[str]:
        """The text's lines (``str.splitlines``), split once."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        return self._lines

    def top_level_code(self) -> set[str]:
        """The module's simple statements, as ``_bare`` makes them (is an ``insert`` there already?)."""
        if self._top_level is None:
            self._top_level = {_bare(s) for s in self.module.body if isinstance(s, cst.SimpleStatementLine)}
        return self._top_level

    def innermost_loop(self, line: int) -> cst.CSTNode | None:
        """The innermost ``for`` / ``while`` whose lines hold ``line``: among the last statement that starts
        at or before it and the statements around that one (any loop holding the line is one of them)."""
        i = bisect.bisect_right(self.starts, line) - 1
        if i < 0:
            return None
        cur: cst.CSTNode | None = self.statements[i]
        while cur is not None:
            if isinstance(cur, (cst.For, cst.While)):
                r = self.range(cur)
                if r.start.line <= line <= r.end.line:
                    return cur
            cur = self.parent.get(cur)
        return None

    def range(self, node: cst.CSTNode) -> CodeRange:
        return self.pos[node]

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement a node belongs to (a compound statement when it sits in its header)."""
        cur: cst.CSTNode | None = node
        while cur is not None:
            if isinstance(cur, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return cur
            cur = self.parent.get(cur)
        raise RewriteError("the node is in no statement")

    def span(self, stmt: cst.CSTNode, whole: bool = True) -> tuple[int, int]:
        """The lines of a statement: all of it, or a compound statement's header only."""
        r = self.range(stmt)
        if whole or not isinstance(stmt, cst.BaseCompoundStatement):
            return r.start.line, r.end.line
        body = stmt.body
        if isinstance(body, cst.IndentedBlock) and body.body:
            first = body.body[0]
            return r.start.line, self.range(first).start.line - 1 - len(getattr(first, "leading_lines", ()))
        return r.start.line, r.start.line

    def ancestors(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        out = []
        cur = self.parent.get(node)
        while cur is not None:
            out.append(cur)
            cur = self.parent.get(cur)
        return out


def _torch_alias(module: cst.Module) -> str | None:
    """The name module-level code reaches torch by (``import torch`` / ``import torch as th``)."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if code_of(alias.name) == "torch":
                        return alias.asname.name.value if alias.asname is not None else "torch"  # type: ignore[union-attr]
    return None


def _bare(stmt: cst.CSTNode) -> str:
    """A statement's code without the comments above it and without whitespace."""
    if isinstance(stmt, cst.SimpleStatementLine):
        stmt = stmt.with_changes(leading_lines=())
    return re.sub(r"\s+", "", code_of(stmt))


def _is_import(stmt: cst.CSTNode) -> bool:
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body
    )


def _is_docstring(stmt: cst.CSTNode) -> bool:
    return (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1
            and isinstance(stmt.body[0], cst.Expr) and isinstance(stmt.body[0].value, (cst.SimpleString, cst.ConcatenatedString)))


def _import_anchor(module: cst.Module) -> int:
    """The index of the last statement of the module's leading block of imports (its docstring
    when it has no import at the top; -1 for neither)."""
    last = -1
    for i, stmt in enumerate(module.body):
        if _is_import(stmt) or (i == 0 and _is_docstring(stmt)):
            last = i
            continue
        break
    return last


# --------------------------------------------------------------------------- the parts of a file

_COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.FunctionDef,
             ast.AsyncFunctionDef, ast.ClassDef, *((ast.Match,) if hasattr(ast, "Match") else ()),
             *((ast.TryStar,) if hasattr(ast, "TryStar") else ()))
_NEWLINE = re.compile(r"\r\n?|\n")
#: Parsed parts of a file kept at once (their LibCST trees take ~300 bytes per byte of source).
MAX_PARTS = 256
#: Top-level statements in a row are parsed together up to about this many bytes: a parse costs ~0.1 ms
#: of its own, the size of 8,000 one-line functions' parses together.
PART_BYTES = 2048
_FALLBACK_INDENT = "    "  # LibCST's, for a file without an indented block


class _Source:
    """A file's text, parsed by LibCST a part at a time: each top-level statement (with those that share
    its lines) is a part of its own, parsed when an edit falls in it, and the module's leading imports
    (and docstring) are one part, where inserts go. Locating an edit, its before/after and the rewrite
    then cost the size of the statements edited, not of the file: a check cuts one snippet per finding,
    and LibCST's parse with positions costs about 30 µs a byte.

    The whole file is one part when Python's ``ast`` cannot parse it or when the module has no leading
    import or docstring (an insert then goes before its first statement, after LibCST's header)."""

    def __init__(self, text: str, parts: bool = True) -> None:
        self.text = text
        self.lines = io.StringIO(text, newline="").readlines()  # ends kept: \n, \r\n or \r, as ast counts lines
        newline = _NEWLINE.search(text)
        self.newline = newline.group(0) if newline is not None else "\n"
        self.parts: list[tuple[int, int]] = [(1, max(1, len(self.lines)))]  # (first, last line) of each part
        self.torch: str | None = None
        self.whole = True
        self.head = -1  # the part that holds the leading imports (-1: none)
        self.indent = _FALLBACK_INDENT
        self._simple: list[tuple[int, int]] = []
        self.anchor_end = 0
        self._index: dict[int, _Index] = {}
        self._top_level: set[str] | None = None
        if not parts:  # the whole file as one part (the tests compare the two)
            return
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return
        groups: list[list[ast.stmt]] = []
        ends: list[int] = []
        for stmt in tree.body:
            first = min([stmt.lineno, *(d.lineno for d in getattr(stmt, "decorator_list", ()))])
            if groups and first <= ends[-1]:  # `a = 1; b = 2`: one line, one statement of LibCST's
                groups[-1].append(stmt)
                ends[-1] = max(ends[-1], stmt.end_lineno or stmt.lineno)
            else:
                groups.append([stmt])
                ends.append(stmt.end_lineno or stmt.lineno)
        anchor = -1
        for i, group in enumerate(groups):
            if all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in group) or (i == 0 and _docstring(group)):
                anchor = i
                continue
            break
        if anchor < 0:
            return
        self.torch = _ast_torch_alias(tree)
        self.indent = _first_indent(tree.body, self.lines) or _FALLBACK_INDENT
        firsts = [min([g[0].lineno, *(d.lineno for d in getattr(g[0], "decorator_list", ()))]) for g in groups]
        # a part runs to the line before the next one: the comments after a block's last statement may be
        # its footer (LibCST's choice, made alike in the part as in the whole file), and move with it. Small
        # statements in a row make one part of about PART_BYTES (a parse has a cost of its own).
        starts = [firsts[0]]
        size = PART_BYTES  # the leading imports are a part of their own
        for i in range(anchor + 1, len(groups)):
            if size >= PART_BYTES:
                starts.append(firsts[i])
                size = 0
            end = firsts[i + 1] - 1 if i + 1 < len(groups) else len(self.lines)
            size += sum(len(x) for x in self.lines[firsts[i] - 1:end])
        self.parts = [(a, b - 1) for a, b in zip(starts, starts[1:], strict=False)] + [(starts[-1], len(self.lines))]
        # the lines of the module's simple statements (their own, without the comments after them)
        self._simple = [(firsts[i], ends[i]) for i in range(len(groups)) if i <= anchor
                        or not any(isinstance(x, _COMPOUND) for x in groups[i])]
        self.anchor_end = ends[anchor]  # the last line of the leading imports: inserts go after it
        self.head = 0
        self.whole = False
        self._starts = [first for first, _last in self.parts]

    def part_at(self, line: int) -> int | None:
        """The part whose lines hold ``line`` (None: a blank or comment line between statements)."""
        if self.whole:
            return 0
        i = bisect.bisect_right(self._starts, line) - 1
        return i if i >= 0 and line <= self.parts[i][1] else None

    def index(self, part: int) -> _Index:
        """The part parsed (the last ``MAX_PARTS`` parsed are kept: a check asks for them in the file's order)."""
        found = self._index.pop(part, None)
        if found is None:
            if self.whole:
                found = _Index(self.text)
            else:
                first, last = self.parts[part]
                found = _Index("".join(self.lines[first - 1:last]), first - 1, self.indent, self.newline)
            if len(self._index) >= MAX_PARTS:
                del self._index[next(iter(self._index))]
        self._index[part] = found  # the most recent last
        return found

    def top_level(self) -> set[str]:
        """The module's simple statements, as ``_bare`` makes them, read from the text."""
        if self._top_level is None:
            if self.whole:
                self._top_level = self.index(0).top_level_code()
            else:
                self._top_level = {re.sub(r"\s+", "", "".join(self.lines[first - 1:last]))
                                   for first, last in self._simple}
        return self._top_level


    def spliced(self, rewritten: dict[int, str], inserts: list[str]) -> str:
        """The text with the parts ``rewritten`` (part → its new text) in place of theirs, and ``inserts``
        after the last of the leading imports."""
        out: list[str] = []
        at = 0  # lines of the file written so far
        for k in sorted({self.head, *rewritten}):
            first, last = self.parts[k]
            out += self.lines[at:first - 1]
            if k == self.head and inserts:
                out += self.lines[first - 1:self.anchor_end]
                if out and not out[-1].endswith(("\n", "\r")):
                    out.append(self.newline)
                out += inserts
                out += self.lines[self.anchor_end:last]
            elif k in rewritten:
                out.append(rewritten[k])
            else:
                out += self.lines[first - 1:last]
            at = last
        out += self.lines[at:]
        return "".join(out)


def _docstring(group: list[ast.stmt]) -> bool:
    return (len(group) == 1 and isinstance(group[0], ast.Expr) and isinstance(group[0].value, ast.Constant)
            and isinstance(group[0].value.value, (str, bytes)))


def _ast_torch_alias(tree: ast.Module) -> str | None:
    """As ``_torch_alias``: the name module-level ``import torch`` binds."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.name == "torch":
                    return alias.asname or "torch"
    return None


def _first_indent(body: list[ast.stmt], lines: list[str]) -> str | None:
    """The indentation of the file's first indented block, as LibCST takes its default indent from the
    first INDENT token: the first statement, in the file's order, that begins a line indented."""
    for stmt in body:
        line = lines[stmt.lineno - 1] if 0 < stmt.lineno <= len(lines) else ""
        lead = line[:len(line) - len(line.lstrip(" \t\f"))]
        if stmt.col_offset > 0 and len(lead) == stmt.col_offset:
            return lead.lstrip("\f") or None
        blocks = [getattr(stmt, "body", None), *(h.body for h in getattr(stmt, "handlers", ())),
                  *(c.body for c in getattr(stmt, "cases", ())), getattr(stmt, "orelse", None),
                  getattr(stmt, "finalbody", None)]
        for block in blocks:
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                found = _first_indent(block, lines)
                if found is not None:
                    return found
    return None


@lru_cache(maxsize=4)
def _source(text: str) -> _Source:
    """One per text: ``check`` cuts a snippet per finding from the same file (read-only use)."""
    return _Source(text)


_NOWHERE: list[_Index] = []


def _nowhere() -> _Index:
    """An empty part: an edit at a line between statements is located there, and refused with its reason."""
    if not _NOWHERE:
        _NOWHERE.append(_Index(""))
    return _NOWHERE[0]

"""``apply``: a file's edits made with LibCST, everything else kept byte for byte.

Each ``Edit`` is first *located* (the node it names, at its line and column) and
*checked* (nothing the script passes makes it unsafe); an edit that fails either is
skipped with the reason. The located edits are then made in one pass of a LibCST
transformer, and the new text must still parse (``ast``) and compile, or nothing is
returned for it. Kinds (``Edit.kind``):

- ``call_args``: keyword arguments of the call ``target`` (``DataLoader``, a method such
  as ``to``) set to ``args`` (value source text) or removed (None). An argument the call
  already passes by keyword gets its new value in place; one it passes by position
  (``positions``) too; a new one is added after the last argument in the call's own
  layout: on its own line when the call puts one argument per line with a trailing
  comma, else after ``, ``. Refused when ``**kwargs`` may hold a keyword it adds, when
  ``*args`` may hold one it would add by name, or when a keyword of ``unless`` is passed
  with a value other than ``False`` / ``None``;
- ``wrap``: the statement (``target`` "statement") or the innermost loop (``target``
  "loop") at the line, put under ``with <code>:``; comments above it stay above the
  ``with``, its own lines move one level in;
- ``insert``: the statement ``code`` after the module's leading imports, once;
- ``assign``: the value of ``<…target> = …`` at the line replaced by ``code``.

``code`` that names ``torch.`` uses the module's own name for torch (``import torch as
th``), and ``import torch`` is added after the leading imports when the module has none.
``requires`` "main-guard": a call at module level must sit under ``if __name__ ==
"__main__":`` (DataLoader workers started by spawn or forkserver import the script again);
"workers": ``persistent_workers=True`` only where the call's ``num_workers`` is above 0: kept
``True`` beside a literal count, written ``persistent_workers=<count> > 0`` beside a count the
call computes when evaluating it twice is safe (``_twice_safe``), refused otherwise
(``rules.edits.dataloader_args``).

The file is read a part at a time (``parts.py``: a top-level statement, or a few small
ones together, parsed by LibCST when an edit falls in it); each edit is located, checked
and made in its part, and the parts changed are spliced back into the file, so that the
work of ``gpudoctor check`` (a before/after per finding) and of ``--fix`` grows with the
file, not with its square.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache

import libcst as cst

from gpudoctor.model.findings import Edit
from gpudoctor.rewrite.parts import (
    WORK,
    Work,
    _bare,
    _import_anchor,
    _Index,
    _nowhere,
    _Source,
    _source,
    _torch_alias,
    code_of,
)
from gpudoctor.rewrite.text import RewriteError, mixed_newlines, newlines_kept

__all__ = ["KINDS", "WORK", "Applied", "Planned", "Work", "apply", "code_of", "plan_edits"]

KINDS = ("call_args", "wrap", "insert", "assign")


_FALSY = {"False", "None", "0"}


@dataclass(frozen=True, slots=True)
class Applied:
    """The file's text with the edits made, and which were made or skipped (with why)."""

    text: str
    done: tuple[Edit, ...] = ()
    skipped: tuple[tuple[Edit, str], ...] = ()
    # the lines (first, last; 1-based) of the statement each edit changed, in the text before: before/after
    spans: tuple[tuple[Edit, int, int], ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.done)


def _is_main_guard(node: cst.CSTNode) -> bool:
    if not isinstance(node, cst.If):
        return False
    text = code_of(node.test).replace("'", '"').replace(" ", "")
    return text in ('__name__=="__main__"', '"__main__"==__name__')


# --------------------------------------------------------------------------- locating and checking


@dataclass(slots=True)
class _Plan:
    calls: dict[cst.Call, list[Edit]] = field(default_factory=lambda: defaultdict(list))
    assigns: dict[cst.Assign, Edit] = field(default_factory=dict)
    wraps: dict[cst.CSTNode, Edit] = field(default_factory=dict)
    inserts: list[str] = field(default_factory=list)  # statements to add after the leading imports
    needs_torch: bool = False


def _locate_call(ix: _Index, e: Edit) -> cst.Call:
    line = e.line - ix.offset  # the part's own line
    starting = ix.calls_at.get((e.target, line), [])
    if e.col is not None:
        exact = [c for c in starting if ix.range(c).start.column == e.col - 1]
        if len(exact) == 1:
            return exact[0]
    # a call that starts on an earlier line and spans this one (the rare case: the calls of that name scanned)
    pool = starting or [c for c in ix.calls_named.get(e.target, ())
                        if ix.range(c).start.line <= line <= ix.range(c).end.line]
    if not pool:
        raise RewriteError(f"no call of {e.target}() at line {e.line} (has the file changed?)")
    if len(pool) > 1:
        inner = [c for c in pool if not any(o is not c and c in ix.ancestors(o) for o in pool)]
        # nested calls of the same name (``x.to(d).to(t)``) or two on one line: which is meant is a guess
        raise RewriteError(f"{len(pool)} calls of {e.target}() at line {e.line}: which one is meant is not clear"
                           if len(inner) != 1 else f"nested calls of {e.target}() at line {e.line}")
    return pool[0]


def _keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a
    return None


def _check_call(ix: _Index, call: cst.Call, e: Edit) -> None:
    """Refuse what could break the call (see the module's documentation)."""
    positions = dict(e.positions)
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    star_at = next((i for i, a in enumerate(call.args) if a.star == "*"), None)
    double = next((a for a in call.args if a.star == "**"), None)
    for name, value in e.args:
        if _keyword(call, name) is not None:
            continue
        pos = positions.get(name)
        if pos is not None and pos < len(positional) and (star_at is None or star_at > pos):
            continue
        if value is None:
            continue  # nothing to remove
        if double is not None:
            raise RewriteError(f"the call passes **{code_of(double.value)}, which may hold {name} already")
        if pos is not None and star_at is not None:
            raise RewriteError(f"the call passes *{code_of(call.args[star_at].value)}, which may hold {name}")
    for name in e.unless:
        a = _keyword(call, name)
        if a is not None and code_of(a.value) not in _FALSY:
            raise RewriteError(f"the call passes {name}={code_of(a.value)}, which "
                               f"{'/'.join(k for k, _ in e.args)} cannot be combined with")
    if "main-guard" in e.requires:
        outer = ix.ancestors(call)
        if not any(isinstance(n, (cst.FunctionDef, cst.Lambda)) or _is_main_guard(n) for n in outer):
            raise RewriteError(
                "it runs at import time, outside any function and without an `if __name__ == \"__main__\":` guard: "
                "worker processes started by spawn or forkserver (macOS, Windows; Linux from Python 3.14) import the "
                "script again")


#: Calls whose result is the same when evaluated twice in one expression, and that change nothing.
_PURE_CALLS = frozenset({"int", "float", "bool", "abs", "round", "min", "max", "len", "os.cpu_count",
                         "multiprocessing.cpu_count", "mp.cpu_count", "os.sched_getaffinity", "psutil.cpu_count",
                         "torch.get_num_threads"})


def _twice_safe(node: cst.BaseExpression) -> bool:
    """Whether evaluating the expression a second time is safe: names, attributes, constants, operators
    and the calls of ``_PURE_CALLS`` of such (``int(opt.workers)``, ``min(8, os.cpu_count())``)."""
    if isinstance(node, (cst.Name, cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(node, cst.Attribute):
        return _twice_safe(node.value)
    if isinstance(node, cst.UnaryOperation):
        return _twice_safe(node.expression)
    if isinstance(node, (cst.BinaryOperation, cst.BooleanOperation)):
        return _twice_safe(node.left) and _twice_safe(node.right)
    if isinstance(node, cst.Comparison):
        return _twice_safe(node.left) and all(_twice_safe(c.comparator) for c in node.comparisons)
    if isinstance(node, cst.IfExp):
        return _twice_safe(node.test) and _twice_safe(node.body) and _twice_safe(node.orelse)
    if isinstance(node, cst.Subscript):
        return _twice_safe(node.value) and all(
            isinstance(el.slice, cst.Index) and _twice_safe(el.slice.value) for el in node.slice)
    if isinstance(node, (cst.Tuple, cst.List)):
        return all(isinstance(el, cst.Element) and _twice_safe(el.value) for el in node.elements)
    if isinstance(node, cst.Call):
        return (code_of(node.func).replace(" ", "") in _PURE_CALLS
                and all(a.star == "" and a.keyword is None and _twice_safe(a.value) for a in node.args))
    return False


def _persistent_value(call: cst.Call, e: Edit) -> str:
    """The value of ``persistent_workers`` that keeps the call valid for every count of workers (requirement
    "workers"); RewriteError when none can be written."""
    new = dict(e.args).get("num_workers")
    if new is not None:
        count: cst.BaseExpression = _expression(new)
    else:
        arg = _keyword(call, "num_workers")
        at = dict(e.positions).get("num_workers")
        positional = [a for a in call.args if a.keyword is None and a.star == ""]
        if arg is None and at is not None and at < len(positional) and not any(
                a.star == "*" for a in call.args[:call.args.index(positional[at])]):
            arg = positional[at]
        if arg is None:
            double = next((a for a in call.args if a.star), None)
            if double is not None:
                raise RewriteError(f"the call passes {double.star}{code_of(double.value)}, which may hold num_workers: "
                                   "persistent_workers=True raises with 0 workers")
            raise RewriteError("the DataLoader passes no num_workers (0: no workers to keep alive; persistent_workers="
                               "True would raise)")
        count = arg.value
    shown = code_of(count)
    try:
        literal = ast.literal_eval(shown)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        literal = None
    if isinstance(literal, int) and not isinstance(literal, bool):
        if literal > 0:
            return "True"
        raise RewriteError(f"num_workers={shown}: no workers to keep alive (persistent_workers=True would raise)")
    if not _twice_safe(count):
        raise RewriteError(f"num_workers={shown} may be 0 and is computed by code that gpudoctor would not run twice: "
                           f"write persistent_workers=... > 0 by hand (persistent_workers=True raises with 0 workers)")
    simple = isinstance(count, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not count.lpar
    return f"{shown if simple or count.lpar else f'({shown})'} > 0"


def _same_args(call: cst.Call, e: Edit) -> bool:
    """Whether the call already passes every keyword as the edit would set it."""
    positions = dict(e.positions)
    positional = [a for a in call.args if a.keyword is None and a.star == ""]
    for name, value in e.args:
        a = _keyword(call, name)
        if a is None and positions.get(name, 1 << 30) < len(positional):
            a = positional[positions[name]]
        if value is None:
            if a is not None:
                return False
        elif a is None or code_of(a.value) != value:
            return False
    return True


def _locate_statement(ix: _Index, e: Edit) -> cst.CSTNode:
    if e.target == "loop":
        loop = ix.innermost_loop(e.line - ix.offset)
        if loop is None:
            raise RewriteError(f"no loop around line {e.line} (has the file changed?)")
        return loop
    starting = ix.statements_at.get(e.line - ix.offset, [])
    if not starting:
        raise RewriteError(f"no statement starts at line {e.line} (has the file changed?)")
    return min(starting, key=lambda s: ix.range(s).start.column)


def _under_same_with(ix: _Index, stmt: cst.CSTNode, code: str) -> bool:
    want = re.sub(r"\s+", "", code).split("(", 1)[0].rsplit(".", 1)[-1]  # "no_grad"
    for node in ix.ancestors(stmt):
        if isinstance(node, cst.With) and any(want in code_of(item.item) for item in node.items):
            return True
        if isinstance(node, cst.FunctionDef):
            if any(want in code_of(d.decorator) for d in node.decorators):
                return True
            break
    return False


def _plan_one(ix: _Index, plan: _Plan, e: Edit,
              top_level: Callable[[], set[str]]) -> tuple[cst.CSTNode | None, bool]:
    """Locate and check one edit, add it to the plan; the statement it changes, and whether all of it
    (False: a compound statement's header only). None: an insert into a module with no leading import."""
    if e.kind == "call_args":
        if not e.target or not e.args:
            raise RewriteError("a call_args edit names no call or no argument")
        call = _locate_call(ix, e)
        _check_call(ix, call, e)
        made = e
        if "workers" in e.requires and dict(e.args).get("persistent_workers") == "True":
            value = _persistent_value(call, e)
            made = replace(e, args=tuple((k, value if k == "persistent_workers" else v) for k, v in e.args))
        if _same_args(call, made):
            raise RewriteError(f"already so: {', '.join(f'{k}={v}' for k, v in made.args if v is not None)}")
        for value in (v for _, v in made.args if v is not None):
            _expression(value)
        plan.calls[call].append(made)
        return ix.statement_of(call), False
    if e.kind == "wrap":
        stmt = _locate_statement(ix, e)
        holder = ix.parent.get(stmt)
        if not isinstance(holder, (cst.IndentedBlock, cst.Module)):
            raise RewriteError(f"the statement at line {e.line} shares its line with its block's header")
        if _under_same_with(ix, stmt, e.code):
            raise RewriteError(f"already under {e.code}")
        if stmt in plan.wraps:
            raise RewriteError(f"the statement at line {e.line} is already wrapped by another edit")
        _expression(e.code)
        plan.wraps[stmt] = e
        plan.needs_torch |= _names_torch(e.code)
        return stmt, True
    if e.kind == "insert":
        statements = _statements(e.code)
        present = top_level()
        if all(_bare(s) in present for s in statements):
            raise RewriteError(f"already there: {e.code}")
        if e.code not in plan.inserts:
            plan.inserts.append(e.code)
        plan.needs_torch |= _names_torch(e.code)
        anchor = _import_anchor(ix.module)
        return (ix.module.body[anchor] if anchor >= 0 else None), True
    if e.kind == "assign":
        for stmt in ix.statements_at.get(e.line - ix.offset, ()):
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if (isinstance(small, cst.Assign) and len(small.targets) == 1
                        and code_of(small.targets[0].target).replace(" ", "").endswith(e.target)):
                    if code_of(small.value) == e.code:
                        raise RewriteError(f"already so: {e.target} = {e.code}")
                    _expression(e.code)
                    plan.assigns[small] = e
                    return stmt, True
        raise RewriteError(f"no assignment to {e.target} at line {e.line} (has the file changed?)")
    raise RewriteError(f"unknown edit kind {e.kind!r} (one of {', '.join(KINDS)})")


def _expression(text: str) -> cst.BaseExpression:
    try:
        return _parsed_expression(text)
    except cst.ParserSyntaxError:
        raise RewriteError(f"not an expression: {text!r}") from None


@lru_cache(maxsize=256)
def _parsed_expression(text: str) -> cst.BaseExpression:
    """An edit's value parsed once (``4``, ``True``: a check makes thousands of the same; nodes are immutable)."""
    return cst.parse_expression(text)


def _statements(text: str) -> list[cst.BaseStatement]:
    try:
        return list(cst.parse_module(text.rstrip("\n") + "\n").body)
    except cst.ParserSyntaxError:
        raise RewriteError(f"not a statement: {text!r}") from None


def _names_torch(code: str) -> bool:
    return re.match(r"\s*torch\.", code) is not None or "\ntorch." in code


def _with_torch(code: str, alias: str | None) -> str:
    if alias is None or alias == "torch":
        return code
    return re.sub(r"(?m)^(\s*)torch\.", rf"\g<1>{alias}.", re.sub(r"(?<![\w.])torch\.", f"{alias}.", code))


# --------------------------------------------------------------------------- the changes


def _set_args(call: cst.Call, e: Edit) -> cst.Call:
    positions = dict(e.positions)
    for name, value in e.args:
        args = list(call.args)
        idx = next((i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value == name), None)
        if idx is None and name in positions:
            positional = [i for i, a in enumerate(args) if a.keyword is None and a.star == ""]
            if positions[name] < len(positional):
                idx = positional[positions[name]]
        if value is None:
            if idx is not None:
                call = _remove_arg(call, idx)
            continue
        expr = _parsed_expression(value)
        if idx is not None:
            args[idx] = args[idx].with_changes(value=expr)
            call = call.with_changes(args=args)
        else:
            call = _append_arg(call, name, expr)
    return call


def _separator(call: cst.Call) -> cst.Comma:
    """The comma and whitespace that separate the call's arguments (a comment on the line not copied)."""
    args = call.args
    sep = args[-2].comma if len(args) >= 2 else None
    if isinstance(sep, cst.Comma):
        ws = sep.whitespace_after
        if isinstance(ws, cst.ParenthesizedWhitespace):
            ws = cst.ParenthesizedWhitespace(indent=ws.indent, last_line=ws.last_line)
        return cst.Comma(whitespace_before=sep.whitespace_before, whitespace_after=ws)
    first = call.whitespace_before_args
    if isinstance(first, cst.ParenthesizedWhitespace):  # f(\n    a,\n): one argument, on its own line
        return cst.Comma(whitespace_after=cst.ParenthesizedWhitespace(indent=first.indent, last_line=first.last_line))
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _append_arg(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    new = cst.Arg(value=value, keyword=cst.Name(name),
                  equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
    args = list(call.args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: the new argument takes it over
        sep = _separator(call)
        if isinstance(last.comma.whitespace_after, cst.ParenthesizedWhitespace) and not isinstance(
                sep.whitespace_after, cst.ParenthesizedWhitespace):
            # a closing parenthesis on its own line after arguments that share lines: the new one joins the last line
            sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        args[-1] = last.with_changes(comma=sep)
        args.append(new.with_changes(comma=last.comma))
    else:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")),
                                     whitespace_after_arg=cst.SimpleWhitespace(""))
        args.append(new.with_changes(whitespace_after_arg=last.whitespace_after_arg))
    return call.with_changes(args=args)


def _remove_arg(call: cst.Call, idx: int) -> cst.Call:
    args = list(call.args)
    gone = args.pop(idx)
    if idx == len(args) and args:  # it was the last: the one before takes over its comma (or none)
        args[-1] = args[-1].with_changes(comma=gone.comma, whitespace_after_arg=gone.whitespace_after_arg)
    return call.with_changes(args=args)


class _Transformer(cst.CSTTransformer):
    def __init__(self, plan: _Plan, torch: str | None, on_path: set[int], inserts: bool = True) -> None:
        super().__init__()
        self.plan = plan
        self.has_torch = torch is not None  # the module imports torch at its top level
        self.torch = torch or "torch"
        self.on_path = on_path  # ids of the nodes that hold an edit's node (and those nodes): the rest is kept as is
        self.inserts = inserts  # the module is the whole file: leave_Module makes the inserts (else apply does)

    def on_visit(self, node: cst.CSTNode) -> bool:
        # a subtree with no edit in it is left whole (not walked): a transform costs the depth of its
        # edits, not the size of the file (a check of a large file makes one per finding)
        return id(node) in self.on_path and super().on_visit(node)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        for e in self.plan.calls.get(original_node, ()):
            updated_node = _set_args(updated_node, e)
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        e = self.plan.assigns.get(original_node)
        return updated_node.with_changes(value=_parsed_expression(e.code)) if e is not None else updated_node

    def _body(self, original: Sequence[cst.CSTNode], updated: Sequence[cst.CSTNode]) -> list:
        out = []
        for o, u in zip(original, updated, strict=True):
            e = self.plan.wraps.get(o)
            out.append(self.wrapped(u, e) if e is not None else u)
        return out

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not any(s in self.plan.wraps for s in original_node.body):
            return updated_node
        return updated_node.with_changes(body=self._body(original_node.body, updated_node.body))

    def wrapped(self, stmt: cst.CSTNode, e: Edit) -> cst.With:
        """``stmt`` under ``with <e.code>:``, the comments above it kept above the ``with``."""
        item = cst.WithItem(item=_parsed_expression(_with_torch(e.code, self.torch)))
        return cst.With(items=[item], body=cst.IndentedBlock(body=[stmt.with_changes(leading_lines=())]),
                        leading_lines=stmt.leading_lines)

    def added(self) -> list[cst.BaseStatement]:
        return _added(self.plan.needs_torch, self.plan.inserts, self.has_torch, self.torch)

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self._body(original_node.body, updated_node.body)
        added = self.added() if self.inserts else []
        if added:
            at = _import_anchor(original_node) + 1
            body[at:at] = added
        return updated_node.with_changes(body=body)


def _added(needs_torch: bool, inserts: Sequence[str], has_torch: bool, torch: str) -> list[cst.BaseStatement]:
    """The statements inserted after the module's leading imports (``import torch`` first if needed)."""
    added: list[cst.BaseStatement] = []
    if needs_torch and not has_torch:
        added += _statements("import torch")
    for n, code in enumerate(inserts):
        stmts = _statements(_with_torch(code, torch))
        if n == 0 and stmts:  # a blank line between the imports and what runs at start-up
            stmts[0] = stmts[0].with_changes(leading_lines=[cst.EmptyLine()])
        added += stmts
    return added


def _on_path(ix: _Index, plan: _Plan) -> set[int]:
    """The ids of the plan's nodes and of every node above them, up to the module."""
    out = {id(ix.module)}
    for node in (*plan.calls, *plan.assigns, *plan.wraps):
        while node is not None and id(node) not in out:
            out.add(id(node))
            node = ix.parent.get(node)
    return out


@dataclass(slots=True)
class _Part:
    """The edits located in one part of the file."""

    ix: _Index
    plan: _Plan = field(default_factory=_Plan)
    # per edit made: the statement it changes (None: an insert into a module without imports) and
    # whether all of it (False: a compound statement's header)
    changes: list[tuple[Edit, cst.CSTNode | None, bool]] = field(default_factory=list)

    def transformer(self, source: _Source) -> _Transformer:
        torch = _torch_alias(self.ix.module) if source.whole else source.torch
        return _Transformer(self.plan, torch, _on_path(self.ix, self.plan), inserts=source.whole)


@dataclass(slots=True)
class Planned:
    """A file's edits located and checked (nothing changed yet): ``apply`` and ``snippet`` make them."""

    source: _Source
    parts: dict[int, _Part]
    done: list[Edit]
    skipped: list[tuple[Edit, str]]

    @property
    def spans(self) -> list[tuple[Edit, int, int]]:
        """The lines (first, last; 1-based, in the file) of the statement each edit changes, before it, in
        the order of the edits."""
        found = {}
        for part in self.parts.values():
            for e, node, whole in part.changes:
                first, last = part.ix.span(node, whole) if node is not None else (1, 0)
                found[id(e)] = (e, first + part.ix.offset, last + part.ix.offset)
        return [found[id(e)] for e in self.done]


def plan_edits(text: str, edits: Sequence[Edit]) -> Planned:
    """Locate and check every edit in ``text`` (RewriteError when LibCST cannot parse the part it is in)."""
    src = _source(text)
    parts: dict[int, _Part] = {}
    done: list[Edit] = []
    skipped: list[tuple[Edit, str]] = []
    for e in edits:
        k = src.head if e.kind == "insert" and not src.whole else src.part_at(e.line)
        # a part keeps the index its plan was made on: the source keeps the last MAX_PARTS parses, and one parsed again has other nodes
        part = _Part(_nowhere()) if k is None else parts[k] if k in parts else parts.setdefault(k, _Part(src.index(k)))
        ix = part.ix
        try:
            node, whole = _plan_one(ix, part.plan, e, src.top_level)
        except RewriteError as err:
            skipped.append((e, str(err)))
            continue
        done.append(e)
        part.changes.append((e, node, whole))
    return Planned(src, {k: p for k, p in sorted(parts.items()) if p.changes}, done, skipped)


def apply(text: str, edits: Sequence[Edit]) -> Applied:
    """``text`` with every edit that can be made safely; RewriteError when the file itself cannot be
    rewritten (LibCST cannot parse it, or the result would not compile: then nothing is changed)."""
    planned = plan_edits(text, edits)
    if not planned.done:
        return Applied(text, (), tuple(planned.skipped), ())
    src = planned.source
    try:
        if src.whole:
            (part,) = planned.parts.values()
            new = part.ix.module.visit(part.transformer(src)).code
        else:
            new = _spliced(planned)
        WORK.rendered_bytes += len(new)
    except (cst.CSTValidationError, cst.ParserSyntaxError, ValueError) as err:
        raise RewriteError(f"the rewrite failed ({type(err).__name__}: {err}); nothing was changed") from None
    new = newlines_kept(text, new) if mixed_newlines(text) else new
    try:
        compile(ast.parse(new), "<rewritten>", "exec")
    except (SyntaxError, ValueError) as err:
        raise RewriteError(f"the rewritten file would not compile ({err}); nothing was changed") from None
    return Applied(new, tuple(planned.done), tuple(planned.skipped), tuple(planned.spans))


def _spliced(planned: Planned) -> str:
    """The file with each part that has edits rewritten, and the inserts after its leading imports."""
    src = planned.source
    head = planned.parts.get(src.head)
    added = _added(any(p.plan.needs_torch for p in planned.parts.values()), head.plan.inserts if head else (),
                   src.torch is not None, src.torch or "torch")
    module = src.index(src.head).module
    rewritten = {k: part.ix.module.visit(part.transformer(src)).code for k, part in planned.parts.items()
                 if k != src.head}  # the head holds the leading imports alone: only inserts change it
    return src.spliced(rewritten, [module.code_for_node(stmt) for stmt in added])

"""Control flow in a function's walk: ``if`` guards, ``with`` blocks, and loops.

``FunctionScanner`` (``walk.py``) walks statements in order; this mixin keeps the
*where* of each one: the loops around it (``Loop``, and what a loop iterates: batches,
counts, parameters), the ``if`` tests guarding it (resolved against argparse defaults
later), whether it runs only every N iterations (``if step % N == 0:``), whether
autograd is off (``torch.no_grad()``), and the values of names after an ``if`` (merged
under its guard).
"""

from __future__ import annotations

import ast
import re

from gpudoctor.rules.static_api.scan import dotted
from gpudoctor.static import knowledge as K
from gpudoctor.static.summary import Loop
from gpudoctor.static.symbolic import UNKNOWN, Sym

_IDENT = re.compile(r"[A-Za-z_]\w*")


class Flow:
    """Guards, ``with`` blocks and loops of ``FunctionScanner`` (its state: loop_stack, guards, no_grad …)."""

    def if_stmt(self, node: ast.If) -> None:
        self.expr(node.test)
        for hook in self.hooks.tests:
            hook(self, node.test)
        guard = self.sym(node.test)
        periodic = bool(self.loop_stack) and _is_periodic(node.test)
        self.guards.append((guard, True))
        if periodic:
            self.periodic_depths.append(len(self.loop_stack))
        self._changed()
        before = dict(self.values)
        for s in node.body:
            self.stmt(s)
        if periodic:
            self.periodic_depths.pop()
        self.guards[-1] = (guard, False)
        self._changed()
        after_body, self.values = self.values, dict(before)  # the else branch starts from the state before the if
        for s in node.orelse:
            self.stmt(s)
        self.guards.pop()
        self._changed()
        self.values = _merge(guard, after_body, _ends(node.body), self.values, _ends(node.orelse))

    def with_stmt(self, node: ast.With | ast.AsyncWith) -> None:
        entered = 0
        for item in node.items:
            ce = item.context_expr
            self.expr(ce)
            target = ce.func if isinstance(ce, ast.Call) else ce
            q = self.ms.qualify(target)
            if q in K.NO_GRAD_CONTEXTS:
                entered += 1
            elif q in K.SET_GRAD_ENABLED and isinstance(ce, ast.Call):
                arg = ce.args[0] if ce.args else None
                if not (isinstance(arg, ast.Constant) and arg.value is True):
                    entered += 1  # False, or decided at run time (train vs eval phase): grad is managed
            if item.optional_vars is not None:
                self.bind(item.optional_vars, None, UNKNOWN, None, False)
        self.no_grad += entered
        if entered:
            self._changed()
        for s in node.body:
            self.stmt(s)
        self.no_grad -= entered
        if entered:
            self._changed()

    # ---------------------------------------------------------------- loops

    def _new_loop(self, node: ast.AST, text: str, batch: bool, iterated: ast.AST | None = None) -> Loop:
        lid = len(self.fs.loops)
        source = self.ms.text_of(node)
        mentions = set(_IDENT.findall(source))
        site = self.ms.site(node)
        body = getattr(node, "body", None)
        if body:  # the header only: a comment in the body must not silence a finding on the loop
            site.end_line = max(site.line, body[0].lineno - 1)
            site.end_col = 0
        loop = Loop(
            id=lid,
            site=site,
            ctx=self.ctx(),
            text=text,
            mentions=frozenset(mentions),
            target_is_batch=batch,
            iter_names=frozenset(_IDENT.findall(self.ms.segment(iterated, 400))) if iterated is not None else frozenset(),
            changes=_changes(node),
        )
        self.fs.loops.append(loop)
        for hook in self.hooks.loops:
            hook(self, node, loop)
        return loop

    def _iter_kind(self, it: ast.AST) -> str:
        """"count" (range / len / modules), "params" / "named_params" (model tensors), "batch" (anything else)."""
        if isinstance(it, ast.Call):
            f = it.func
            if isinstance(f, ast.Name):
                if f.id in ("range", "len"):
                    return "count"
                if f.id in ("enumerate", "tqdm", "iter", "reversed", "sorted", "list") and it.args:
                    return self._iter_kind(it.args[0])
                if f.id == "zip":
                    kinds = {self._iter_kind(a) for a in it.args}
                    return "batch" if "batch" in kinds else next(iter(kinds), "batch")
            if isinstance(f, ast.Attribute):
                if f.attr in ("parameters", "buffers"):
                    return "params"
                if f.attr in ("named_parameters", "named_buffers"):
                    return "named_params"
                if f.attr in K.PARAM_ITERATORS:
                    return "count"  # modules / children / state_dict: not batches, not tensors we track
                if f.attr in ("items", "keys", "values") and not self._tainted(f.value):
                    return "count"
                q = self.ms.qualify(f)
                if q and q.split(".")[-1] in ("tqdm", "trange") and it.args:
                    return "count" if q.endswith("trange") else self._iter_kind(it.args[0])
        if isinstance(it, (ast.List, ast.Tuple, ast.Constant, ast.Set)):
            return "count"
        if isinstance(it, ast.Name) and self.places.get(it.id) == "val":
            return "count"
        return "batch"

    def for_loop(self, node: ast.For | ast.AsyncFor) -> None:
        self.expr(node.iter)
        kind = self._iter_kind(node.iter)
        text = "for " + self.ms.segment(node.target, 60) + " in " + self.ms.segment(node.iter, 60) + ":"
        loop = self._new_loop(node, text, kind == "batch", node.iter)
        self.loop_stack.append(loop.id)
        self._changed()
        if kind == "count":
            self.bind(node.target, None, UNKNOWN, "val", False)
        elif kind == "params":
            self.bind(node.target, None, UNKNOWN, "dev", False)
        elif kind == "named_params":
            target = node.target
            if isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
                self.bind(target.elts[0], None, UNKNOWN, "val", False)
                self.bind(target.elts[1], None, UNKNOWN, "dev", False)
            else:
                self.bind(target, None, UNKNOWN, None, False)
        else:
            self._bind_batch_target(node.target, node.iter)
        for s in node.body:
            self.stmt(s)
        self.loop_stack.pop()
        self._changed()
        for s in node.orelse:
            self.stmt(s)

    def _bind_batch_target(self, target: ast.AST, it: ast.AST) -> None:
        # enumerate(loader): the index is a count, the rest a batch.
        if (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id == "enumerate"
            and isinstance(target, (ast.Tuple, ast.List))
            and len(target.elts) == 2
        ):
            self.bind(target.elts[0], None, UNKNOWN, "val", False)
            self.bind(target.elts[1], None, UNKNOWN, "host", True)
            return
        self.bind(target, None, UNKNOWN, "host", True)

    def while_loop(self, node: ast.While) -> None:
        loop = self._new_loop(node, "while " + self.ms.segment(node.test, 60) + ":", True)
        self.loop_stack.append(loop.id)
        self._changed()
        self.expr(node.test)
        for hook in self.hooks.tests:
            hook(self, node.test)
        for s in node.body:
            self.stmt(s)
        self.loop_stack.pop()
        self._changed()
        for s in node.orelse:
            self.stmt(s)



#: A value merged after an ``if`` (``x = a if test else b``) is kept when it is this small (nodes).
_MERGE_SIZE = 48


def _ends(body: list[ast.stmt]) -> bool:
    """Whether a branch never falls through (it ends in return / raise / continue / break)."""
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def _merge(guard: Sym, body: dict[str, Sym], body_ends: bool, orelse: dict[str, Sym], else_ends: bool) -> dict[str, Sym]:
    """The values after an ``if``: a name the branches set differently is ``("if", guard, a, b)``."""
    if body_ends and not else_ends:
        return orelse
    if else_ends:
        return body if not body_ends else orelse
    out = dict(orelse)
    for key, a in body.items():
        b = orelse.get(key, UNKNOWN)
        if a is b or a == b:
            continue
        merged = ("if", guard, a, b)
        out[key] = merged if _small(merged, _MERGE_SIZE) else UNKNOWN
    for key in orelse.keys() - body.keys():
        merged = ("if", guard, UNKNOWN, orelse[key])
        out[key] = merged if _small(merged, _MERGE_SIZE) else UNKNOWN
    return out


def _small(sym: Sym, limit: int) -> bool:
    """Whether a Sym has at most ``limit`` nodes (it is resolved in time linear in them)."""
    stack = [sym]
    seen = 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(item, tuple):
            stack.extend(x for x in item if isinstance(x, tuple))
    return True


def _is_periodic(test: ast.AST) -> bool:
    """``if step % 100 == 0:`` (every N steps) or ``if step == 0:`` (once): not per step."""
    for node in ast.walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            return True
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq)
            and any(isinstance(x, ast.Constant) and type(x.value) is int for x in (node.left, *node.comparators))
            and any(isinstance(x, (ast.Name, ast.Attribute)) for x in (node.left, *node.comparators))
        ):
            return True
    return False


def _changes(node: ast.AST) -> frozenset[str]:
    """``Loop.changes``: the dotted receivers of the attribute assignments and method calls in a loop."""
    out: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in (sub.targets if isinstance(sub, ast.Assign) else [sub.target]):
                if isinstance(target, ast.Attribute):
                    name = dotted(target.value)
                    if name:
                        out.add(name)
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            name = dotted(sub.func.value)
            if name:
                out.add(name)
    return frozenset(out)

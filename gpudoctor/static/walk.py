"""One function's walk: statements in order, and assignments.

``FunctionScanner`` walks a function body (or a module's top level) once, in
statement order. Its state is per name (``values.py``: Syms, places, batch taint,
modules, DataLoaders); the *where* of each statement (the loops around it, the
``if`` tests guarding it, every-N-steps ``if``s, ``torch.no_grad()``) is
``flow.py``'s, expressions and calls ``calls.py``'s. This module dispatches the
statements, binds names, and gives a framework's step methods (Lightning, the HF
Trainer) the loop their framework runs them in.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from gpudoctor.rules.static_api.names import COMPILE, MODEL_NAME, optimizer_class
from gpudoctor.rules.static_api.scan import dotted as _dotted
from gpudoctor.rules.static_api.scan import last as _last
from gpudoctor.rules.static_api.scan import root_name as _root_name
from gpudoctor.static import knowledge as K
from gpudoctor.static.calls import Calls, hooks
from gpudoctor.static.flow import Flow
from gpudoctor.static.summary import Ctx, FuncSummary, LoaderFact
from gpudoctor.static.symbolic import UNKNOWN, Sym
from gpudoctor.static.values import _BIN_OPS, Values

if TYPE_CHECKING:
    from gpudoctor.static.scan import ModuleScanner

class FunctionScanner(Values, Calls, Flow):
    """The walk of one function (see the module documentation); ``finish()`` gives its ``FuncSummary``."""

    def __init__(
        self, ms: ModuleScanner, node: ast.AST, fid: str, cls: str | None, outer_nested: dict[str, str]
    ) -> None:
        self.ms = ms
        self.node = node
        name = getattr(node, "name", "<module>")
        self.fs = FuncSummary(fid=fid, name=name, cls=cls, line=getattr(node, "lineno", 1))
        self.key = f"{ms.spath}::{fid}"
        self.is_module = isinstance(node, ast.Module)
        self.nested: dict[str, str] = dict(outer_nested)
        # the state per name (read through values.py)
        self.values: dict[str, Sym] = {}
        self.places: dict[str, str] = {}
        self.taint: set[str] = set()  # batch-derived names (loop targets over data, parameters, next())
        self.derived: dict[str, ast.AST] = {}  # name -> the value it was last assigned (taint is lazy)
        self.modules: set[str] = set()
        self.instances: dict[str, tuple] = {}
        self.loader_of: dict[str, LoaderFact] = {}
        self.loader_nodes: dict[int, LoaderFact] = {}
        self.optimizer_vars: set[str] = set()
        self.in_memory_vars: set[str] = set()
        self.eval_receivers: set[str] = set()
        self.backward_receivers: set[str] = set()
        # names no worker started by spawn / forkserver can unpickle: lambdas, what the function defines itself
        # (a class, a function), instances of its own classes → what they are ("a lambda" …)
        self.unpicklable: dict[str, str] = {}
        # where the walk is: loops, every-N-steps `if`s, guards, no_grad (Ctx)
        self.loop_stack: list[int] = []
        self.periodic_depths: list[int] = []
        self.guards: list[tuple] = []
        self.no_grad = 0
        self.grad_off = False
        self.cuda_facts = 0
        self.cuda_maybe = 0
        self.framework = ""  # the framework that runs this method's class (Scan.framework)
        self.pending_assign: tuple[int, tuple[str | None, ...]] | None = None
        self._ctx: Ctx | None = None
        self._called: set[str] | None = None
        self.hooks = hooks()  # the rules' Watches

    # ---------------------------------------------------------------- context

    def ctx(self) -> Ctx:
        if self._ctx is None:
            periodic: set[int] = set()
            for d in self.periodic_depths:
                periodic.update(self.loop_stack[:d])
            self._ctx = Ctx(
                loops=tuple(self.loop_stack),
                periodic=frozenset(periodic),
                periodic_any=bool(self.periodic_depths),
                guards=tuple(self.guards),
                no_grad=self.no_grad > 0 or self.grad_off,
            )
        return self._ctx

    def _changed(self) -> None:
        self._ctx = None

    # ---------------------------------------------------------------- entry points

    def walk_function(self) -> None:
        node = self.node
        assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        names = [a.arg for a in positional] + [a.arg for a in args.kwonlyargs]
        self.fs.params = tuple(names)
        defaults = list(args.defaults)
        first_default = len(positional) - len(defaults)
        for i, a in enumerate(positional):
            default = self.sym(defaults[i - first_default]) if i >= first_default else None
            if default is not None and default is not UNKNOWN:
                self.fs.param_defaults[a.arg] = default
            self.values[a.arg] = ("param", self.key, a.arg, i, default)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=False):
            default = self.sym(d) if d is not None else None
            if default is not None and default is not UNKNOWN:
                self.fs.param_defaults[a.arg] = default
            self.values[a.arg] = ("param", self.key, a.arg, -1, default)
        skip = {"self", "cls"}
        for n in names:
            if n in skip:
                continue
            if MODEL_NAME.match(n):
                self.modules.add(n)
            elif n in K.NAMESPACE_NAMES:
                pass
            else:
                self.taint.add(n)
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            q = self.ms.qualify(target)
            if q in K.NO_GRAD_CONTEXTS:
                self.fs.no_grad_decorated = True
            elif q in COMPILE:
                self.fact("compile", dec)
        if self.fs.cls and node.name in K.FRAMEWORK_STEP_METHODS:
            self.fs.framework_step = True
        self._prepass(node)
        role = self._framework_role(node, names)
        if role == "step":
            # the framework's loop runs this method once per training step: a loop around its body
            loop = self._new_loop(node, f"def {node.name}({', '.join(names)}):", True)
            loop.framework = self.framework
            self.loop_stack.append(loop.id)
            self._changed()
            self.walk_body(node.body)
            self.loop_stack.pop()
            self._changed()
            return
        if role == "eval":
            self.no_grad += 1  # Lightning runs its evaluation steps under inference_mode, HF's under no_grad
            self._changed()
        self.walk_body(node.body)

    def _framework_role(self, node: ast.FunctionDef | ast.AsyncFunctionDef, names: list[str]) -> str:
        """"step" / "eval" for a step method of a class a framework drives, else "". Its batch is on the
        device already (Lightning and the HF Trainer move it there before they call the method)."""
        info = self.ms.summary.classes.get(self.fs.cls or "")
        if info is None or not info.framework:
            return ""
        self.framework = info.framework
        steps, evals = K.FRAMEWORK_METHODS[info.framework]
        step = next((m for m in steps if m in info.methods), None)
        role = "step" if node.name == step else "eval" if node.name in evals else ""
        if role == "eval":
            self.record("framework_eval", node, text=f"{node.name}()", extra=info.framework)
        if role:
            self.fs.framework_step = role == "step"
            batch = "inputs" if "inputs" in names else names[1] if len(names) > 1 else None
            if batch is not None:
                self.places[batch] = "dev"
                self.taint.add(batch)
        return role

    def _prepass(self, node: ast.AST) -> None:
        """Names whose ``.backward()`` is called are tensors (losses), wherever they were made."""
        text = self.ms.text_of(node)
        start = text.find(".backward")
        while start >= 0:
            i = start
            while i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_."):
                i -= 1
            receiver = text[i:start].strip(".")
            if receiver and (receiver[0].isalpha() or receiver[0] == "_"):
                self.backward_receivers.add(receiver)
            start = text.find(".backward", start + 9)

    def finish(self) -> FuncSummary:
        self.fs.nested = {k: v for k, v in self.nested.items()}
        return self.fs

    # ---------------------------------------------------------------- statements

    def walk_body(self, body: list[ast.stmt]) -> None:
        if self.is_module and body is self.ms.tree.body:
            self._prepass(self.ms.tree)
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:  # noqa: C901 - one dispatch
        t = type(node)
        if t is ast.Expr:
            value = node.value
            if isinstance(value, ast.Call):
                q = self.ms.qualify(value.func)
                if q in K.SET_GRAD_ENABLED and value.args:
                    arg = value.args[0]
                    self.grad_off = isinstance(arg, ast.Constant) and arg.value is False
                    self._changed()
            self.expr(value)
        elif t is ast.Assign:
            self.assign(node.targets, node.value)
        elif t is ast.AnnAssign:
            if node.value is not None:
                self.assign([node.target], node.value)
        elif t is ast.AugAssign:
            self.expr(node.value)
            self.aug_assign(node)
        elif t in (ast.For, ast.AsyncFor):
            self.for_loop(node)
        elif t is ast.While:
            self.while_loop(node)
        elif t is ast.If:
            self.if_stmt(node)
        elif t in (ast.With, ast.AsyncWith):
            self.with_stmt(node)
        elif t is ast.Try or t.__name__ == "TryStar":
            for s in node.body:
                self.stmt(s)
            for h in node.handlers:
                for s in h.body:
                    self.stmt(s)
            for s in (*node.orelse, *node.finalbody):
                self.stmt(s)
        elif t is ast.Return:
            if node.value is not None:
                self.expr(node.value)
                self.returned(node.value)
        elif t in (ast.FunctionDef, ast.AsyncFunctionDef):
            self.define_function(node)
        elif t is ast.ClassDef:
            self.define_class(node)
        elif t in (ast.Import, ast.ImportFrom):
            if not self.is_module:
                self.ms.add_import(node)
        elif t.__name__ == "Match":
            self.expr(node.subject)
            for case in node.cases:
                for s in case.body:
                    self.stmt(s)
        elif t is ast.Assert:
            self.expr(node.test)
            for hook in self.hooks.tests:
                hook(self, node.test)
        elif t in (ast.Raise, ast.Delete):
            return
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def not_picklable(self, node: ast.AST | None) -> str:
        """Why a worker process started by spawn or forkserver could not unpickle this value ("" when nothing
        says so): a lambda, a class or function the function defines itself, or an instance of such a class."""
        if isinstance(node, ast.Lambda):
            return "a lambda"
        if isinstance(node, ast.Name):
            return self.unpicklable.get(node.id, "")
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and self.unpicklable.get(func.id, "").startswith("a class"):
                return f"an instance of {func.id}, {self.unpicklable[func.id]}"
            if self.ms.qualify(func) == "functools.partial" and node.args:
                return self.not_picklable(node.args[0])
        return ""

    def define_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if self.is_module:
            fid = node.name
            self.ms.queue_function(node, fid, None, {})
        else:
            fid = f"{self.fs.fid}.<locals>.{node.name}"
            self.nested[node.name] = fid
            self.ms.queue_function(node, fid, None, dict(self.nested))
            self.unpicklable[node.name] = f"a function defined inside {self.fs.name}()"
        for dec in node.decorator_list:
            self.expr(dec)
        self.values[node.name] = UNKNOWN

    def define_class(self, node: ast.ClassDef) -> None:
        prefix = "" if self.is_module else f"{self.fs.fid}.<locals>."
        if not self.is_module:
            self.ms._register_class(node, prefix)
            self.unpicklable[node.name] = f"a class defined inside {self.fs.name}()"
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.ms.queue_function(item, f"{prefix}{node.name}.{item.name}", node.name, {})
            elif isinstance(item, ast.ClassDef):
                continue
            else:
                self.stmt(item)

    # ---------------------------------------------------------------- assignment

    def assign(self, targets: list[ast.expr], value: ast.expr) -> None:
        names = tuple(_target_names(targets[0])) if len(targets) == 1 else ()
        for target in targets:
            if isinstance(target, ast.Name):
                why = self.not_picklable(value)
                if why:
                    self.unpicklable[target.id] = why
                else:
                    self.unpicklable.pop(target.id, None)
        if isinstance(value, ast.Call) and names:
            self.pending_assign = (id(value), names)
        self.expr(value)
        self.pending_assign = None
        for target in targets:
            if isinstance(target, ast.Attribute):
                self._setting(target, value)
            self._assign_one(target, value)

    def _setting(self, target: ast.Attribute, value: ast.AST) -> None:
        """``torch.backends.cudnn.benchmark = ...`` and the other global switches: the rules' hooks."""
        q = self.ms.qualify(target)
        if q is None:
            return
        for hook in self.hooks.settings.get(q, ()):
            hook(self, target, value, q)

    def _assign_one(self, target: ast.AST, value: ast.AST | None) -> None:
        if (
            isinstance(target, (ast.Tuple, ast.List))
            and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)
            and not any(isinstance(e, ast.Starred) for e in value.elts)
        ):
            for t, v in zip(target.elts, value.elts, strict=False):
                self._assign_one(t, v)
            return
        if value is None:
            self.bind(target, None, UNKNOWN, None, False)
            return
        place = self.place(value)
        tainted: bool | ast.AST = value
        if isinstance(target, (ast.Tuple, ast.List)):
            elt_place = place if place in ("host", "dev") else None
            if isinstance(value, ast.Call) and self._is_model_call(value):
                elt_place = "dev"
            for elt in target.elts:
                self.bind(elt.value if isinstance(elt, ast.Starred) else elt, None, UNKNOWN, elt_place, tainted)
            return
        self.bind(target, value, self.sym(value), place, tainted)

    def bind(
        self, target: ast.AST, value: ast.AST | None, sym: Sym, place: str | None, tainted: bool | ast.AST
    ) -> None:
        """Bind a name. ``tainted``: True (a batch), False, or the expression it derives from."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind(elt.value if isinstance(elt, ast.Starred) else elt, None, UNKNOWN, place, tainted)
            return
        if isinstance(target, ast.Starred):
            self.bind(target.value, None, UNKNOWN, place, tainted)
            return
        if isinstance(target, ast.Subscript):
            base = _root_name(target)
            if base:
                self.values[base] = UNKNOWN  # a mutated dict: its ** expansion is no longer known
            return
        if isinstance(target, ast.Name):
            key = target.id
        elif isinstance(target, ast.Attribute):
            key = _dotted(target) or ""
            if not key:
                return
            if self.fs.cls and key.startswith("self.") and key.count(".") == 1:
                # what the class keeps in self.name, for its other methods (`if self.ngpu > 1:`)
                attrs, name = self.ms.summary.attrs, f"{self.fs.cls}.{key[5:]}"
                attrs[name] = sym if attrs.get(name, sym) == sym else UNKNOWN
        else:
            return
        self.values[key] = sym
        if place is None:
            self.places.pop(key, None)
        else:
            self.places[key] = place
        if tainted is True:
            self.taint.add(key)
            self.derived.pop(key, None)
        elif isinstance(tainted, ast.AST):
            self.taint.discard(key)
            self.derived[key] = tainted
        else:
            self.taint.discard(key)
            self.derived.pop(key, None)
        self.modules.discard(key)
        self.loader_of.pop(key, None)
        self.instances.pop(key, None)
        self.optimizer_vars.discard(key)
        self.in_memory_vars.discard(key)
        if value is None:
            return
        if self._is_module_expr(value):
            self.modules.add(key)
        loader = self._loader_in(value)
        if loader is not None:
            self.loader_of[key] = loader
            loader.bindings.append(_last(key))
        if isinstance(value, ast.Call):
            q = self.ms.qualify(value.func)
            if optimizer_class(q):
                self.optimizer_vars.add(key)
            if q in K.IN_MEMORY_DATASETS:
                self.in_memory_vars.add(key)
            if isinstance(value.func, ast.Attribute) and value.func.attr in ("parse_args", "parse_known_args"):
                self.ms.namespaces.add(key)
            ref = self._class_ref(value.func)
            if ref is not None:
                self.instances[key] = ref
        if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Call):
            f = value.value.func
            if isinstance(f, ast.Attribute) and f.attr == "parse_known_args":
                self.ms.namespaces.add(key)
        if isinstance(value, ast.Name) and value.id in self.loader_of:
            self.loader_of[key] = self.loader_of[value.id]
            self.loader_of[key].bindings.append(_last(key))

    def aug_assign(self, node: ast.AugAssign) -> None:
        target = node.target
        key = _dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
        if key is None:
            return
        old = self.places.get(key)
        new = self.place(node.value)
        if "dev" in (old, new):
            self.places[key] = "dev"
        elif old == new and old is not None:
            self.places[key] = old
        elif new == "val" and old is None:
            self.places[key] = "val"
        else:
            self.places.pop(key, None)
        op = _BIN_OPS.get(type(node.op))
        prev = self.values.get(key, UNKNOWN)
        self.values[key] = ("bin", op, prev, self.sym(node.value)) if op else UNKNOWN

    def returned(self, value: ast.AST) -> None:
        if isinstance(value, ast.Tuple):
            for i, elt in enumerate(value.elts):
                f = self._loader_in(elt)
                if f is not None:
                    f.returned_index = i
            return
        f = self._loader_in(value)
        if f is not None:
            f.returned_index = -1

    def _loader_in(self, value: ast.AST) -> LoaderFact | None:
        """The DataLoader a value is, or wraps (``accelerator.prepare(DataLoader(...))``)."""
        if isinstance(value, ast.Name):
            return self.loader_of.get(value.id)
        if isinstance(value, ast.Call):
            f = self.loader_nodes.get(id(value))
            if f is not None:
                return f
            for a in value.args:
                if isinstance(a, (ast.Call, ast.Name)):
                    f = self._loader_in(a)
                    if f is not None:
                        return f
        return None


def _target_names(target: ast.AST) -> list[str | None]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Attribute):
        return [target.attr]
    if isinstance(target, (ast.Tuple, ast.List)):
        out: list[str | None] = []
        for e in target.elts:
            if isinstance(e, ast.Name):
                out.append(e.id)
            elif isinstance(e, ast.Attribute):
                out.append(e.attr)
            else:
                out.append(None)
        return out
    return []

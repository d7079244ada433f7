"""One module's AST -> ``ModuleSummary``: the facts the checks need, with their contexts.

The scanner walks each function body once, in statement order, keeping a small
abstract state per name:

- its *Sym* (``symbolic.py``): the value when the source fixes it, ``args.x``
  references, ``torch.cuda.is_available()`` …;
- its *place* when it is a tensor: ``"dev"`` (may live on the GPU: a model's
  output, a ``.to(device)`` result, a loss), ``"host"`` (a batch fresh from a
  DataLoader, a ``.cpu()`` result) or ``"val"`` (a Python value);
- whether it derives from a batch (a loop target over a DataLoader, ``next(it)``,
  a parameter) — only those ``.to(device)`` calls are batch copies;
- whether it holds a module (model, loss) or a DataLoader.

Nothing is imported or executed. Facts record the loops around them, the
``if`` tests guarding them (to be resolved against argparse defaults later) and
whether they sit under ``torch.no_grad()``.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from gpudoctor.static import knowledge as K
from gpudoctor.static.sources import (
    ImportResolver,
    module_name,
    parse_source,
    read_source,
    suppressions,
)
from gpudoctor.static.summary import (
    Call,
    ClassInfo,
    Ctx,
    Fact,
    FileError,
    FuncSummary,
    LoaderFact,
    Loop,
    Marker,
    ModuleSummary,
    OptimizerFact,
    Site,
    Sync,
    Transfer,
)
from gpudoctor.static.symbolic import POSITIVE, UNKNOWN, ArgDef, Sym, const

_CUDA_STR = re.compile(r"^(cuda(:\d+)?|nccl|gpu)$")
_DTYPES = frozenset(
    {"float16", "half", "bfloat16", "float32", "float", "float64", "double", "int64", "long", "int32", "int",
     "int16", "short", "int8", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"}
)
_LOW_PRECISION = frozenset({"float16", "half", "bfloat16"})
_NAMESPACE_NAMES = frozenset({"args", "opt", "opts", "flags", "FLAGS", "hparams", "hp", "cfg", "options", "cli_args"})
_LOG_METHODS = frozenset({"info", "debug", "warning", "log", "add_scalar", "add_scalars", "set_postfix", "write"})
_CMP_OPS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_BIN_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%"}
_MAX_CUDA_FACTS = 2
_IDENT = re.compile(r"[A-Za-z_]\w*")
_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_SYM_DEPTH = 12


def scan_file(path: str, display: str, roots: list[str]) -> tuple[ModuleSummary | None, FileError | None]:
    """Read, parse and scan one file. Never raises for a problem of the file itself."""
    p = Path(path)
    text, err = read_source(p, display)
    if err is not None:
        return None, err
    assert text is not None
    tree, err = parse_source(text, display)
    if err is not None:
        return None, err
    assert tree is not None
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20000))  # the walk recurses once per nesting level
    try:
        return ModuleScanner(p, display, text, tree, _resolver(roots)).run(), None
    except RecursionError:
        return None, FileError(display, f"{display}: too deeply nested to check; skipped")
    finally:
        sys.setrecursionlimit(limit)


_RESOLVERS: dict[tuple[str, ...], ImportResolver] = {}


def reset_caches() -> None:
    """Forget directory listings (a new check may see files that were added since)."""
    _RESOLVERS.clear()


def _resolver(roots: list[str]) -> ImportResolver:
    """One resolver (and its directory listings) per set of project folders, per process."""
    key = tuple(roots)
    found = _RESOLVERS.get(key)
    if found is None:
        if len(_RESOLVERS) > 8:
            _RESOLVERS.clear()
        found = _RESOLVERS[key] = ImportResolver([Path(r) for r in roots])
    return found


# --------------------------------------------------------------------------- module


class ModuleScanner:
    def __init__(self, path: Path, display: str, text: str, tree: ast.Module, resolver: ImportResolver) -> None:
        self.path = path
        self.spath = str(path)
        self.text = text
        self.tree = tree
        self.resolver = resolver
        self.src_lines = text.splitlines()
        self.modname = module_name(path)
        self.summary = ModuleSummary(path=str(path), display=display, modname=self.modname)
        self.aliases: dict[str, str] = {}  # local name -> qualified dotted name
        self.local_modules: dict[str, str] = {}  # alias (maybe dotted) -> path of a project module
        self.top_defs: dict[str, str] = {}  # top-level function name -> fid
        self.pending: list[tuple[ast.AST, str, str | None, dict[str, str]]] = []
        self.module_nn_classes: set[str] = set()
        self.namespaces: set[str] = set(_NAMESPACE_NAMES)
        self.mentions_cuda = "cuda" in text

    # ---------------------------------------------------------------- imports

    def _absolute(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = self.modname.split(".")
        if self.path.name != "__init__.py":
            base = base[:-1]
        if level > 1:
            base = base[: len(base) - (level - 1)] if len(base) >= level - 1 else []
        return ".".join([*base, *([module] if module else [])])

    def add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self.aliases[a.asname] = a.name
                    target = self.resolver.resolve(self.path, a.name)
                    if target:
                        self.local_modules[a.asname] = target
                        self.summary.imports[a.asname] = (target, "")
                else:
                    top = a.name.split(".")[0]
                    self.aliases[top] = top
                    target = self.resolver.resolve(self.path, a.name)
                    if target:
                        self.local_modules[a.name] = target
                        self.summary.imports[a.name] = (target, "")
            return
        level = node.level or 0
        absolute = self._absolute(node.module, level)
        base_target = self.resolver.resolve(self.path, node.module or "", level) if (node.module or level) else None
        for a in node.names:
            if a.name == "*":
                continue
            local = a.asname or a.name
            self.aliases[local] = f"{absolute}.{a.name}" if absolute else a.name
            sub = self.resolver.resolve(self.path, f"{node.module}.{a.name}" if node.module else a.name, level)
            if sub:
                self.local_modules[local] = sub
                self.summary.imports[local] = (sub, "")
            elif base_target:
                self.summary.imports[local] = (base_target, a.name)

    # ---------------------------------------------------------------- helpers

    def qualify(self, node: ast.AST) -> str | None:
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name):
            base = self.aliases.get(node.id)
            if base is None:
                return None
            parts.append(base)
            return ".".join(reversed(parts))
        return None

    def text_of(self, node: ast.AST) -> str:
        """The source lines a node spans (whole lines)."""
        if isinstance(node, ast.Module):
            return self.text
        start = getattr(node, "lineno", 1) - 1
        end = getattr(node, "end_lineno", None) or start + 1
        return "\n".join(self.src_lines[start:end])

    def _chars(self, line: int, col: int) -> int:
        if 0 < line <= len(self.src_lines):
            text = self.src_lines[line - 1]
            if not text.isascii():
                return len(text.encode("utf-8")[:col].decode("utf-8", "replace"))
        return col

    def site(self, node: ast.AST) -> Site:
        line = getattr(node, "lineno", 1)
        end_line = getattr(node, "end_lineno", None) or line
        end_col = getattr(node, "end_col_offset", None)
        return Site(
            line,
            self._chars(line, getattr(node, "col_offset", 0)) + 1,
            end_line,
            self._chars(end_line, end_col) + 1 if end_col is not None else 0,
        )

    def segment(self, node: ast.AST, limit: int = 100) -> str:
        line = getattr(node, "lineno", 0)
        if not (0 < line <= len(self.src_lines)):
            return ""
        text = self.src_lines[line - 1]
        raw = text.encode("utf-8")
        start = getattr(node, "col_offset", 0)
        end_line = getattr(node, "end_lineno", line)
        end = getattr(node, "end_col_offset", None) if end_line == line else None
        piece = raw[start:end].decode("utf-8", "replace") if end is not None else raw[start:].decode("utf-8", "replace")
        piece = piece.strip()
        if end_line != line:
            piece += " …"
        return piece if len(piece) <= limit else piece[: limit - 1] + "…"

    # ---------------------------------------------------------------- run

    def run(self) -> ModuleSummary:
        body = self.tree.body
        # Imports and definitions first, so that names used above their import resolve.
        for node in _top_level(body):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self.add_import(node)
        for node in _top_level(body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.top_defs[node.name] = node.name
            elif isinstance(node, ast.ClassDef):
                self._register_class(node, prefix="")
        module_fn = FunctionScanner(self, self.tree, "<module>", None, {})
        module_fn.walk_body(body)
        self.summary.functions["<module>"] = module_fn.finish()
        for name, value in module_fn.values.items():
            if value is not UNKNOWN and value[0] != "param":
                self.summary.constants[name] = value
        # Function bodies (queued as they were met), including nested ones.
        i = 0
        while i < len(self.pending):
            node, fid, cls, outer_nested = self.pending[i]
            i += 1
            fs = FunctionScanner(self, node, fid, cls, outer_nested)
            fs.walk_function()
            self.summary.functions[fid] = fs.finish()
        self.summary.suppress = suppressions(self.text)
        self._keep_lines()
        return self.summary

    def _register_class(self, node: ast.ClassDef, prefix: str) -> None:
        qual = f"{prefix}{node.name}"
        bases = tuple(filter(None, (_dotted(b) for b in node.bases)))
        methods: dict[str, str] = {}
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[item.name] = f"{qual}.{item.name}"
        self.summary.classes[node.name] = ClassInfo(node.name, bases, methods)
        if any(b.split(".")[-1] in ("Module", "LightningModule") for b in bases):
            self.module_nn_classes.add(node.name)

    def queue_function(self, node: ast.AST, fid: str, cls: str | None, nested: dict[str, str]) -> None:
        self.pending.append((node, fid, cls, nested))

    def _keep_lines(self) -> None:
        wanted: set[int] = set()
        for fs in self.summary.functions.values():
            for item in (*fs.syncs, *fs.transfers, *fs.loaders, *fs.optimizers):
                wanted.update(range(item.site.line, min(item.site.end_line, item.site.line + 12) + 1))
            for loop in fs.loops:  # the header and the first lines of the body (fix snippets)
                wanted.update(range(loop.site.line, loop.site.end_line + 3))
            for marker in fs.markers:
                wanted.add(marker.site.line)
            for fact in fs.facts:
                if fact.kind != "cuda":
                    wanted.update(range(fact.site.line, min(fact.site.end_line, fact.site.line + 3) + 1))
        for d in self.summary.argdefs:
            wanted.add(d.line)
        n = len(self.src_lines)
        self.summary.lines = {i: self.src_lines[i - 1] for i in sorted(wanted) if 0 < i <= n}


def _top_level(body: list[ast.stmt]):
    """Statements at module level, looking into if / try / with blocks (guarded imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level(node.body)
            for h in node.handlers:
                yield from _top_level(h.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _last(dotted: str | None) -> str:
    return dotted.rsplit(".", 1)[-1] if dotted else ""


def _root_name(node: ast.AST) -> str | None:
    while True:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Starred):
            node = node.value
        else:
            return None


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


# --------------------------------------------------------------------------- function


class FunctionScanner:
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
        self.loop_stack: list[int] = []
        self.periodic_depths: list[int] = []
        self.guards: list[tuple] = []
        self.no_grad = 0
        self.grad_off = False
        self.cuda_facts = 0
        self.pending_assign: tuple[int, tuple[str | None, ...]] | None = None
        self._ctx: Ctx | None = None
        self._called: set[str] | None = None

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

    def fact(self, kind: str, node: ast.AST, value: Sym | None = None, extra: str = "") -> None:
        if kind == "cuda":
            if self.cuda_facts >= _MAX_CUDA_FACTS:
                return
            self.cuda_facts += 1
        self.fs.facts.append(Fact(kind, self.ms.site(node), self.ctx(), value, self.ms.segment(node), extra))

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
            if K.MODEL_NAME.match(n):
                self.modules.add(n)
            elif n in _NAMESPACE_NAMES:
                pass
            else:
                self.taint.add(n)
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            q = self.ms.qualify(target)
            if q in K.NO_GRAD_CONTEXTS:
                self.fs.no_grad_decorated = True
            elif q in K.COMPILE:
                self.fact("compile", dec)
        if self.fs.cls and node.name in K.FRAMEWORK_STEP_METHODS:
            self.fs.framework_step = True
        self._prepass(node)
        self.walk_body(node.body)

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
        elif t in (ast.Raise, ast.Assert, ast.Delete):
            return
        else:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child)

    def define_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if self.is_module:
            fid = node.name
            self.ms.queue_function(node, fid, None, {})
        else:
            fid = f"{self.fs.fid}.<locals>.{node.name}"
            self.nested[node.name] = fid
            self.ms.queue_function(node, fid, None, dict(self.nested))
        for dec in node.decorator_list:
            self.expr(dec)
        self.values[node.name] = UNKNOWN

    def define_class(self, node: ast.ClassDef) -> None:
        prefix = "" if self.is_module else f"{self.fs.fid}.<locals>."
        if not self.is_module:
            self.ms._register_class(node, prefix)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.ms.queue_function(item, f"{prefix}{node.name}.{item.name}", node.name, {})
            elif isinstance(item, ast.ClassDef):
                continue
            else:
                self.stmt(item)

    def if_stmt(self, node: ast.If) -> None:
        self.expr(node.test)
        guard = self.sym(node.test)
        periodic = bool(self.loop_stack) and _is_periodic(node.test)
        self.guards.append((guard, True))
        if periodic:
            self.periodic_depths.append(len(self.loop_stack))
        self._changed()
        for s in node.body:
            self.stmt(s)
        if periodic:
            self.periodic_depths.pop()
        self.guards[-1] = (guard, False)
        self._changed()
        for s in node.orelse:
            self.stmt(s)
        self.guards.pop()
        self._changed()

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
        model_calls: set[str] = set()
        for m in _CALLEE.finditer(source):
            d = m.group(1)
            if d.endswith(".forward"):
                d = d[: -len(".forward")]
            elif not (K.MODEL_NAME.match(_last(d)) or d in self.modules or d in self.eval_receivers):
                continue
            if d.split(".", 1)[0] in self.ms.aliases:
                continue  # a library call (torch.nn.functional.…), not a model
            model_calls.add(d)
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
            model_calls=frozenset(model_calls),
            eval_before=frozenset(self.eval_receivers),
            target_is_batch=batch,
            iter_names=frozenset(_IDENT.findall(self.ms.segment(iterated, 400))) if iterated is not None else frozenset(),
        )
        self.fs.loops.append(loop)
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
        for s in node.body:
            self.stmt(s)
        self.loop_stack.pop()
        self._changed()
        for s in node.orelse:
            self.stmt(s)

    # ---------------------------------------------------------------- assignment

    def assign(self, targets: list[ast.expr], value: ast.expr) -> None:
        names = tuple(_target_names(targets[0])) if len(targets) == 1 else ()
        if isinstance(value, ast.Call) and names:
            self.pending_assign = (id(value), names)
        self.expr(value)
        self.pending_assign = None
        for target in targets:
            if isinstance(target, ast.Attribute):
                self._setting(target, value)
            self._assign_one(target, value)

    def _setting(self, target: ast.Attribute, value: ast.AST) -> None:
        """``torch.backends.cudnn.benchmark = ...`` and the other global switches."""
        q = self.ms.qualify(target)
        if q is None:
            return
        if q == K.CUDNN_BENCHMARK:
            self.fact("cudnn_benchmark", target, self.sym(value))
        elif q == K.CUDNN_DETERMINISTIC:
            self.fact("cudnn_deterministic", target, self.sym(value))
        elif q in K.TF32_FLAGS:
            self.fact("tf32", target, self.sym(value), extra=q)

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
            if K.optimizer_class(q):
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

    # ---------------------------------------------------------------- expressions

    def expr(self, node: ast.AST | None) -> None:  # noqa: C901 - one dispatch
        if node is None:
            return
        t = type(node)
        if t is ast.Call:
            self.call(node)
            return
        if t is ast.Name or t is ast.Lambda:
            return
        if t is ast.Constant:
            if isinstance(node.value, str) and len(node.value) <= 8 and _CUDA_STR.match(node.value):
                self.fact("cuda", node)
            return
        if t is ast.Attribute:
            if self.cuda_facts < _MAX_CUDA_FACTS and self.ms.mentions_cuda and node.attr != "cuda":
                q = self.ms.qualify(node)
                if q and q.startswith("torch.cuda."):
                    self.fact("cuda", node)
            self.expr(node.value)
            return
        if t is ast.JoinedStr:
            for v in node.values:
                if isinstance(v, ast.FormattedValue):
                    self.expr(v.value)
                    if self.place(v.value) == "dev":
                        self.sync("GD102", "f-string of a tensor", v.value)
            return
        if t in (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp):
            for gen in node.generators:
                self.expr(gen.iter)
                kind = self._iter_kind(gen.iter)
                if kind in ("count", "named_params"):
                    self.bind(gen.target, None, UNKNOWN, None if kind == "named_params" else "val", False)
                else:
                    iter_place = self.place(gen.iter)
                    p = "dev" if kind == "params" else (iter_place if iter_place in ("dev", "host") else None)
                    self.bind(gen.target, None, UNKNOWN, p, gen.iter)
                for cond in gen.ifs:
                    self.expr(cond)
            if t is ast.DictComp:
                self.expr(node.key)
                self.expr(node.value)
            else:
                self.expr(node.elt)
            return
        if t is ast.IfExp:
            # `torch.autocast(...) if use_amp else nullcontext()`: each branch runs under its test
            self.expr(node.test)
            test = self.sym(node.test)
            for branch, polarity in ((node.body, True), (node.orelse, False)):
                self.guards.append((test, polarity))
                self._changed()
                self.expr(branch)
                self.guards.pop()
                self._changed()
            return
        if t is ast.NamedExpr:
            self.expr(node.value)
            self.bind(node.target, node.value, self.sym(node.value), self.place(node.value), node.value)
            return
        fields = _EXPR_FIELDS.get(t)
        if fields is None:
            for child in ast.iter_child_nodes(node):
                self.expr(child)
            return
        for name in fields:
            child = getattr(node, name, None)
            if child is None:
                continue
            if type(child) is list:
                for c in child:
                    if c is not None:
                        self.expr(c)
            else:
                self.expr(child)

    def call(self, node: ast.Call) -> None:  # noqa: C901 - the patterns are one table
        func = node.func
        meth = func.attr if isinstance(func, ast.Attribute) else None
        recv = func.value if isinstance(func, ast.Attribute) else None
        if recv is not None:
            self.expr(recv)
        elif not isinstance(func, ast.Name):
            self.expr(func)
        for a in node.args:
            self.expr(a.value if isinstance(a, ast.Starred) else a)
        for k in node.keywords:
            self.expr(k.value)

        q = self.ms.qualify(func)
        if q is not None:
            self._qualified_call(node, q)
        if meth is not None and recv is not None:
            self._method_call(node, meth, recv)
        elif isinstance(func, ast.Name):
            name = func.id
            if name == "print" and name not in self.values:
                for a in node.args:
                    if self.place(a) == "dev":
                        self.sync("GD102", "print(<tensor>)", a, whole=node)
                        break
            elif name in ("float", "int", "bool") and len(node.args) == 1 and self.place(node.args[0]) == "dev":
                self.sync("GD102", f"{name}(<tensor>)", node.args[0], whole=node)
        ref = self.callee_ref(func)
        if ref is not None:
            assigned: tuple[str | None, ...] = ()
            if self.pending_assign and self.pending_assign[0] == id(node):
                assigned = self.pending_assign[1]
            args = tuple(UNKNOWN if isinstance(a, ast.Starred) else self.sym(a) for a in node.args)
            kwargs = tuple((k.arg, self.sym(k.value)) for k in node.keywords if k.arg)
            self.fs.calls.append(Call(ref, self.ms.site(node), self.ctx(), args, kwargs, assigned))

    def _qualified_call(self, node: ast.Call, q: str) -> None:  # noqa: C901
        if q in K.DATALOADERS:
            self.loader(node)
        elif K.optimizer_class(q):
            self.optimizer(node, K.optimizer_class(q) or "")
        elif q in K.DATA_PARALLEL:
            self.fact("data_parallel", node, extra=q)
        elif q in K.DDP:
            self.fact("ddp", node, extra=q)
        elif q in K.EMPTY_CACHE:
            self.fact("empty_cache", node)
        elif q in K.AUTOCAST:
            enabled = self._kwnode(node, "enabled")
            device = node.args[0] if node.args else self._kwnode(node, "device_type")
            extra = ""
            if device is not None:
                ds = self.sym(device)
                extra = str(ds[1]) if ds[0] == "k" else ""
            self.fact("autocast", node, self.sym(enabled) if enabled is not None else const(True), extra)
            if K.AUTOCAST[q]:
                self.fact("autocast_deprecated", node, extra=f"{q}|{K.AUTOCAST[q]}")
        elif q in K.GRAD_SCALER:
            if K.GRAD_SCALER[q]:
                self.fact("scaler_deprecated", node, extra=f"{q}|{K.GRAD_SCALER[q]}")
            enabled = self._kwnode(node, "enabled")
            self.fact("grad_scaler", node, self.sym(enabled) if enabled is not None else const(True))
        elif q in K.CONV_LAYERS:
            self.fact("conv", node, extra=q)
        elif self._is_cnn(node, q):
            self.fact("conv", node, extra=q)
        elif q in K.COMPILE:
            self.fact("compile", node)
        elif q in K.JIT:
            self.fact("jit", node)
        elif q == K.DETERMINISTIC_ALGORITHMS:
            self.fact("deterministic_algorithms", node, self.sym(node.args[0]) if node.args else const(True))
        elif q == K.MATMUL_PRECISION:
            self.fact("tf32", node, self.sym(node.args[0]) if node.args else UNKNOWN, extra=q)
        elif q in _MIXED_PRECISION_FRAMEWORKS:
            self._framework_precision(node, q)
        elif q == "torch.set_num_threads":
            self.fact("set_num_threads", node, self.sym(node.args[0]) if node.args else UNKNOWN)
        elif q == "torch.autograd.backward":
            self.marker("backward", node)
        elif q.startswith("torch.cuda."):
            self.fact("cuda", node)

    def _framework_precision(self, node: ast.Call, q: str) -> None:
        """Mixed precision switched on through a framework (Accelerate, Lightning, HF Trainer)."""
        kind = _MIXED_PRECISION_FRAMEWORKS[q]
        if kind == "accelerate":
            self.fact("cuda", node)  # Accelerate places everything on the accelerator it finds
            value = self._kwnode(node, "mixed_precision")
            if value is not None:
                self.fact("autocast", node, ("cmp", ("not in",), (self.sym(value), const(("no", None, "fp8")))))
        elif kind == "lightning":
            value = self._kwnode(node, "precision")
            if value is not None:
                mixed = const(("16-mixed", "bf16-mixed", "16", "bf16", 16, "bf16-true", "16-true"))
                self.fact("autocast", node, ("cmp", ("in",), (self.sym(value), mixed)))
        else:
            flags = [self._kwnode(node, k) for k in ("fp16", "bf16")]
            syms = tuple(self.sym(v) for v in flags if v is not None)
            if syms:
                self.fact("autocast", node, ("or", syms))

    def _is_cnn(self, node: ast.Call, q: str) -> bool:
        if q.startswith("torchvision.models."):
            return bool(K.CNN_FAMILIES.match(q.rsplit(".", 1)[-1]))
        if q in ("timm.create_model", "torch.hub.load"):
            for a in node.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str) and K.CNN_FAMILIES.match(a.value):
                    return True
        return False

    def _method_call(self, node: ast.Call, meth: str, recv: ast.AST) -> None:  # noqa: C901
        if meth == "backward":
            self.marker("backward", node)
            return
        if meth == "step":
            d = _dotted(recv) or ""
            last = _last(d)
            if (
                d in self.optimizer_vars
                or (last and K.OPTIMIZER_NAME.match(last))
                or (last and K.SCALER_NAME.search(last) and node.args)
            ):
                self.marker("optimizer.step", node)
            return
        if meth == "eval" and not node.args:
            d = _dotted(recv)
            if d:
                self.eval_receivers.add(d)
            return
        if meth == "train":
            d = _dotted(recv)
            if d:
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and arg.value is False:
                    self.eval_receivers.add(d)
                else:
                    self.eval_receivers.discard(d)
            return
        if meth == "add_argument":
            self.argument(node)
            return
        if meth == "set_defaults":
            for k in node.keywords:
                if k.arg:
                    self.ms.summary.arg_overrides[k.arg] = self.sym(k.value)
            return
        if meth == "update" and isinstance(recv, ast.Name) and len(node.args) == 1 and not node.keywords:
            # kwargs.update(cuda_kwargs): the merged dict, when the enclosing `if` tests hold
            prev = self.values.get(recv.id, UNKNOWN)
            merged = ("merge", prev, self.sym(node.args[0]))
            if self.guards:
                conds = tuple(g if polarity else ("not", g) for g, polarity in self.guards)
                merged = ("if", ("and", conds), merged, prev)
            self.values[recv.id] = merged
            return
        if meth in ("update", "setdefault", "pop", "clear") and isinstance(recv, ast.Name):
            self.values[recv.id] = UNKNOWN
            return
        if meth == "item" and not node.args:
            if self.place(recv) not in ("host", "val") and not self._numpy_rooted(recv):
                self.sync("GD102", ".item()", recv, whole=node)
            return
        if meth == "cpu":
            if self.place(recv) not in ("host", "val") and not self._is_module_ref(recv):
                self.sync("GD303", ".cpu()", recv, whole=node)
            return
        if meth == "numpy":
            if isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute) and recv.func.attr in ("cpu", "to"):
                return
            if self.place(recv) == "dev":
                self.sync("GD303", ".numpy()", recv, whole=node)
            return
        if meth == "tolist":
            if self.place(recv) == "dev":
                self.sync("GD303", ".tolist()", recv, whole=node)
            return
        if meth == "to":
            target = self._to_target(node)
            if target == "cpu":
                if self.place(recv) not in ("host", "val") and not self._is_module_ref(recv):
                    self.sync("GD303", '.to("cpu")', recv, whole=node)
            elif target == "cuda":
                self.fact("cuda", node)
                self._transfer(node, recv, ".to")
            elif target == "dtype" and self._is_module_ref(recv) and self._low_precision_arg(node):
                self.fact("low_precision", node)
            return
        if meth == "cuda":
            self.fact("cuda", node)
            self._transfer(node, recv, ".cuda")
            return
        if meth == "pin_memory":
            self.fact("pin_memory_call", node)
            return
        if meth in ("half", "bfloat16") and self._is_module_ref(recv):
            self.fact("low_precision", node)
            return
        if meth == "format" and isinstance(recv, ast.Constant):
            for a in (*node.args, *(k.value for k in node.keywords)):
                if self.place(a) == "dev":
                    self.sync("GD102", "str.format(<tensor>)", a, whole=node)
                    return
            return
        if meth in _LOG_METHODS:
            values: list[ast.AST] = [*node.args, *(k.value for k in node.keywords)]
            for a in list(values):
                if isinstance(a, ast.Dict):
                    values.extend(v for v in a.values if v is not None)
            for a in values:
                if self.place(a) == "dev":
                    self.sync("GD102", f"{meth}(<tensor>)", a, whole=node)
                    return

    # ---------------------------------------------------------------- specific calls

    def loader(self, node: ast.Call) -> None:
        kwargs: dict[str, Sym] = {}
        stars: list[Sym] = []
        for i, a in enumerate(node.args):
            if isinstance(a, ast.Starred):
                stars.append(UNKNOWN)
                break
            if i < len(K.DATALOADER_POSITIONAL):
                kwargs[K.DATALOADER_POSITIONAL[i]] = self.sym(a)
        dataset = node.args[0] if node.args and not isinstance(node.args[0], ast.Starred) else None
        for k in node.keywords:
            if k.arg is None:
                stars.append(self.sym(k.value))
            else:
                kwargs[k.arg] = self.sym(k.value)
                if k.arg == "dataset":
                    dataset = k.value
        worker_init = None
        init = self._kwnode(node, "worker_init_fn")
        if isinstance(init, ast.Call) and self.ms.qualify(init.func) == "functools.partial" and init.args:
            ref = self.callee_ref(init.args[0])
            if ref is not None:
                worker_init = (
                    ref,
                    tuple(self.sym(a) for a in init.args[1:]),
                    tuple((k.arg, self.sym(k.value)) for k in init.keywords if k.arg),
                )
        elif isinstance(init, (ast.Name, ast.Attribute)):
            ref = self.callee_ref(init)
            if ref is not None:
                worker_init = (ref, (), ())
        in_memory = False
        if isinstance(dataset, ast.Call):
            in_memory = self.ms.qualify(dataset.func) in K.IN_MEMORY_DATASETS
        elif isinstance(dataset, ast.Name):
            in_memory = dataset.id in self.in_memory_vars
        fact = LoaderFact(
            site=self.ms.site(node),
            ctx=self.ctx(),
            kwargs=kwargs,
            stars=tuple(stars),
            text=self.ms.segment(node, 160),
            in_memory=in_memory,
            worker_init=worker_init,
        )
        self.fs.loaders.append(fact)
        self.loader_nodes[id(node)] = fact

    def optimizer(self, node: ast.Call, cls: str) -> None:
        kwargs = {k.arg: self.sym(k.value) for k in node.keywords if k.arg}
        star = any(k.arg is None for k in node.keywords)
        self.fs.optimizers.append(
            OptimizerFact(cls, self.ms.site(node), self.ctx(), kwargs, star, self.ms.segment(node, 160))
        )

    def argument(self, node: ast.Call) -> None:
        flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if not flags:
            return
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        long = next((f for f in flags if f.startswith("--")), None)
        if "dest" in kw and isinstance(kw["dest"], ast.Constant):
            dest = str(kw["dest"].value)
        elif long:
            dest = long[2:].replace("-", "_")
        elif flags[0].startswith("-"):
            dest = flags[0].lstrip("-").replace("-", "_")
        else:
            dest = flags[0]
        shown = long or flags[0]
        action = kw.get("action")
        action_name = action.value if isinstance(action, ast.Constant) else _last(_dotted(action)) if action else ""
        if "default" in kw:
            default = self.sym(kw["default"])
            typ = _dotted(kw["type"]) if "type" in kw else None
            if default[0] == "k" and isinstance(default[1], str) and typ in ("int", "float"):
                try:
                    default = const(int(default[1]) if typ == "int" else float(default[1]))
                except ValueError:
                    pass
        elif action_name == "store_true":
            default = const(False)
        elif action_name == "store_false":
            default = const(True)
        else:
            default = const(None)
        self.ms.summary.argdefs.append(ArgDef(dest, shown, default, self.ms.spath, node.lineno))

    def marker(self, kind: str, node: ast.AST) -> None:
        self.fs.markers.append(Marker(kind, self.ms.site(node), self.ctx()))

    def sync(self, code: str, pattern: str, operand: ast.AST, whole: ast.AST | None = None) -> None:
        shown = whole if whole is not None else operand
        self.fs.syncs.append(Sync(code, pattern, self.ms.segment(shown, 80), self.ms.site(shown), self.ctx()))

    def _transfer(self, node: ast.Call, recv: ast.AST, method: str) -> None:
        if self._is_module_ref(recv) or not self._tainted(recv):
            return
        nb = self._kwnode(node, "non_blocking")
        nb_sym: Sym | None = self.sym(nb) if nb is not None else None
        if nb is None and method == ".cuda" and len(node.args) >= 2:
            nb_sym = self.sym(node.args[1])
        line = self.ms.src_lines[node.lineno - 1] if 0 < node.lineno <= len(self.ms.src_lines) else ""
        self.fs.transfers.append(
            Transfer(self.ms.segment(node, 80), method, nb_sym, self.ms.site(node), self.ctx(), line.strip())
        )

    def _to_target(self, node: ast.Call) -> str | None:
        """"cpu", "cuda" (a device that may be a GPU), "dtype", or None."""
        dev = self._kwnode(node, "device")
        if dev is None and node.args:
            dev = node.args[0]
        if dev is None:
            return "dtype" if self._kwnode(node, "dtype") is not None else None
        return self._device_kind(dev)

    def _device_kind(self, dev: ast.AST) -> str | None:
        if isinstance(dev, ast.Constant):
            v = dev.value
            if isinstance(v, str):
                low = v.lower()
                if low.startswith("cpu"):
                    return "cpu"
                if low.startswith("cuda"):
                    return "cuda"
                return None
            if type(v) is int:
                return "cuda"
            return None
        if isinstance(dev, ast.Call):
            q = self.ms.qualify(dev.func)
            if q == "torch.device" and dev.args:
                return self._device_kind(dev.args[0])
            return None
        if isinstance(dev, (ast.Name, ast.Attribute)):
            q = self.ms.qualify(dev)
            if q and q.startswith("torch.") and q.rsplit(".", 1)[-1] in _DTYPES:
                return "dtype"
            d = _dotted(dev) or ""
            s = self.values.get(d)
            if s is not None and s[0] == "k" and isinstance(s[1], str):
                return "cpu" if s[1].startswith("cpu") else "cuda" if s[1].startswith("cuda") else None
            if d.endswith(".device") or K.DEVICE_NAME.search(_last(d)):
                return "cuda"
        return None

    def _low_precision_arg(self, node: ast.Call) -> bool:
        for a in (*node.args, *(k.value for k in node.keywords)):
            q = self.ms.qualify(a) if isinstance(a, (ast.Name, ast.Attribute)) else None
            if q and q.rsplit(".", 1)[-1] in _LOW_PRECISION:
                return True
        return False

    # ---------------------------------------------------------------- abstract values

    @staticmethod
    def _kwnode(node: ast.Call, name: str) -> ast.AST | None:
        for k in node.keywords:
            if k.arg == name:
                return k.value
        return None

    def _tainted(self, node: ast.AST, seen: set[str] | None = None) -> bool:
        """Whether a value derives from a batch: a name bound to one, or assigned from one."""
        if not self.taint:
            return False
        seen = set() if seen is None else seen
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                if self._name_tainted(sub.id, seen):
                    return True
            elif isinstance(sub, ast.Attribute):
                d = _dotted(sub)
                if d and d in self.taint or (d in self.derived and self._name_tainted(d, seen)):
                    return True
            elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "next":
                return True
        return False

    def _name_tainted(self, name: str, seen: set[str]) -> bool:
        if name in self.taint:
            return True
        source = self.derived.get(name)
        if source is None or name in seen:
            return False
        seen.add(name)
        return self._tainted(source, seen)

    def _numpy_rooted(self, node: ast.AST) -> bool:
        root = _root_name(node)
        if root is None:
            return False
        q = self.ms.aliases.get(root, "")
        return q.split(".")[0] in ("numpy", "math", "random", "pandas")

    def _is_module_ref(self, node: ast.AST) -> bool:
        """A model or loss module: by construction, by name, or because the function calls it."""
        d = _dotted(node)
        if not d:
            return False
        if d in self.modules or K.MODEL_NAME.match(_last(d)):
            return True
        if self._called is None:  # a tensor is never called: a called name is a module or a function
            self._called = set(_CALLEE.findall(self.ms.text_of(self.node)))
        return d in self._called

    def _is_model_call(self, node: ast.Call) -> bool:
        d = _dotted(node.func)
        if not d:
            return False
        if d in self.modules or d in self.eval_receivers:
            return True
        if K.MODEL_NAME.match(_last(d)) and not self.ms.qualify(node.func):
            return True
        return False

    def _is_module_expr(self, value: ast.AST) -> bool:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda", "half", "bfloat16", "float", "train", "eval"):
            inner = func.value
            return self._is_module_ref(inner) or self._is_module_expr(inner)
        q = self.ms.qualify(func)
        if q:
            last = q.rsplit(".", 1)[-1]
            if q.startswith("torch.nn.") and last[:1].isupper() and q not in K.DATA_PARALLEL:
                return True
            if q in K.DATA_PARALLEL or q in K.DDP or q in K.COMPILE or q.startswith("torchvision.models."):
                return True
            if q in ("timm.create_model", "copy.deepcopy"):
                return True
        if isinstance(func, ast.Name) and func.id in self.ms.module_nn_classes:
            return True
        d = _dotted(func)
        return bool(d) and bool(re.match(r"(make|build|create|get|load)_?(model|net|network)", _last(d) or "", re.I))

    def _class_ref(self, func: ast.AST) -> tuple | None:
        if isinstance(func, ast.Name) and (func.id in self.ms.summary.classes or func.id in self.ms.summary.imports):
            return ("name", func.id)
        return None

    def place(self, node: ast.AST, depth: int = 0) -> str | None:  # noqa: C901
        """"dev" / "host" / "val" / None (unknown): where a value lives, if it is a tensor."""
        if depth > 20:
            return None
        t = type(node)
        if t is ast.Name:
            p = self.places.get(node.id)
            if p is None and node.id in self.backward_receivers:
                return "dev"
            return p
        if t is ast.Constant or t is ast.JoinedStr:
            return "val"
        if t is ast.Attribute:
            if node.attr in K.META_ATTRS:
                return "val"
            d = _dotted(node)
            if d is not None and d in self.places:
                return self.places[d]
            if d is not None and d in self.backward_receivers:
                return "dev"
            inner = self.place(node.value, depth + 1)
            return inner if inner in ("dev", "host") else None
        if t is ast.Subscript:
            inner = self.place(node.value, depth + 1)
            return inner if inner in ("dev", "host") else None
        if t is ast.BinOp:
            return _combine(self.place(node.left, depth + 1), self.place(node.right, depth + 1))
        if t is ast.UnaryOp:
            return self.place(node.operand, depth + 1)
        if t is ast.Compare:
            p = self.place(node.left, depth + 1)
            for c in node.comparators:
                p = _combine(p, self.place(c, depth + 1))
            return p
        if t is ast.IfExp:
            a, b = self.place(node.body, depth + 1), self.place(node.orelse, depth + 1)
            return a if a == b else None
        if t is ast.Call:
            return self._call_place(node, depth)
        return None

    def _call_place(self, node: ast.Call, depth: int) -> str | None:  # noqa: C901
        func = node.func
        if isinstance(func, ast.Attribute):
            m = func.attr
            if m in ("cpu", "numpy", "pin_memory"):
                return "host"
            if m in K.VALUE_METHODS:
                return "val"
            if m == "cuda":
                return "dev"
            if m == "to":
                kind = self._to_target(node)
                if kind == "cpu":
                    return "host"
                if kind == "cuda":
                    return "dev"
            q = self.ms.qualify(func)
            if q is not None:
                return self._torch_fn_place(node, q, depth)
            inner = self.place(func.value, depth + 1)
            if inner in ("dev", "host"):
                return inner
            if self._is_model_call(node):
                return "dev"
            return None
        if isinstance(func, ast.Name):
            if func.id in ("float", "int", "len", "str", "bool", "repr", "format", "round") and func.id not in self.values:
                return "val"
            q = self.ms.qualify(func)
            if q is not None:
                return self._torch_fn_place(node, q, depth)
            if self._is_model_call(node):
                return "dev"
        return None

    def _torch_fn_place(self, node: ast.Call, q: str, depth: int) -> str | None:
        if q.startswith(("numpy.", "pandas.", "math.")):
            return "host"
        if not q.startswith("torch."):
            return None
        if q.startswith(("torch.cuda.", "torch.backends.", "torch.distributed.", "torch.utils.")):
            return None
        dev = self._kwnode(node, "device")
        if dev is not None:
            kind = self._device_kind(dev)
            return "dev" if kind == "cuda" else "host" if kind == "cpu" else None
        places = {self.place(a.value if isinstance(a, ast.Starred) else a, depth + 1) for a in node.args}
        for a in node.args:
            if isinstance(a, (ast.List, ast.Tuple)):
                places.update(self.place(e, depth + 1) for e in a.elts)
        if "dev" in places:
            return "dev"
        if q.rsplit(".", 1)[-1] in ("tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full",
                                    "arange", "randn", "rand", "randint", "linspace", "stack", "cat"):
            return "host" if "host" in places or q.rsplit(".", 1)[-1] not in ("stack", "cat") else None
        if "host" in places:
            return "host"
        return None

    def sym(self, node: ast.AST | None, depth: int = 0) -> Sym:  # noqa: C901
        if node is None or depth > _SYM_DEPTH:
            return UNKNOWN
        t = type(node)
        if t is ast.Constant:
            v = node.value
            return const(v) if isinstance(v, (int, float, str, bool, type(None))) else UNKNOWN
        if t is ast.Name:
            n = node.id
            if n in self.values:
                return self.values[n]
            if n in self.ms.summary.constants:
                return self.ms.summary.constants[n]
            imp = self.ms.summary.imports.get(n)
            if imp and imp[1]:
                return ("imp", imp[0], imp[1])
            return UNKNOWN
        if t is ast.Attribute:
            d = _dotted(node)
            if d is not None and d in self.values:
                return self.values[d]
            base = node.value
            if isinstance(base, ast.Name) and base.id in self.ms.namespaces:
                return ("arg", node.attr)
            if isinstance(base, ast.Attribute) and base.attr in self.ms.namespaces:
                return ("arg", node.attr)
            if node.attr == "type":
                inner = self.sym(base, depth + 1)
                if inner is not UNKNOWN:
                    return ("devtype", inner)
            if isinstance(base, ast.Name):
                mod = self.ms.summary.imports.get(base.id)
                if mod and not mod[1]:
                    return ("imp", mod[0], node.attr)
            return UNKNOWN
        if t is ast.Call:
            return self._call_sym(node, depth)
        if t is ast.IfExp:
            return ("if", self.sym(node.test, depth + 1), self.sym(node.body, depth + 1), self.sym(node.orelse, depth + 1))
        if t is ast.UnaryOp:
            inner = self.sym(node.operand, depth + 1)
            if isinstance(node.op, ast.Not):
                return ("not", inner)
            if isinstance(node.op, ast.USub) and inner[0] == "k" and isinstance(inner[1], (int, float)):
                return const(-inner[1])
            return UNKNOWN
        if t is ast.BoolOp:
            return ("and" if isinstance(node.op, ast.And) else "or", tuple(self.sym(v, depth + 1) for v in node.values))
        if t is ast.Compare:
            ops = tuple(_CMP_OPS.get(type(o), "?") for o in node.ops)
            return ("cmp", ops, tuple(self.sym(v, depth + 1) for v in (node.left, *node.comparators)))
        if t is ast.BinOp:
            op = _BIN_OPS.get(type(node.op))
            if op is None:
                return UNKNOWN
            return ("bin", op, self.sym(node.left, depth + 1), self.sym(node.right, depth + 1))
        if t is ast.Dict:
            items = []
            for k, v in zip(node.keys, node.values, strict=False):
                if k is None or not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
                    return UNKNOWN
                items.append((k.value, self.sym(v, depth + 1)))
            return ("dict", tuple(items))
        if t in (ast.Tuple, ast.List):
            if all(isinstance(e, ast.Constant) for e in node.elts):
                return const(tuple(e.value for e in node.elts))
            return UNKNOWN
        return UNKNOWN

    def _call_sym(self, node: ast.Call, depth: int) -> Sym:
        q = self.ms.qualify(node.func)
        if q in K.CUDA_AVAILABLE:
            return ("cuda",)
        if q == "torch.device" and node.args:
            return self.sym(node.args[0], depth + 1)
        if q in ("os.cpu_count", "multiprocessing.cpu_count", "torch.get_num_threads", "psutil.cpu_count"):
            return POSITIVE
        func = node.func
        if isinstance(func, ast.Name):
            n = func.id
            if n in ("min", "max", "int", "float", "bool", "str") and not node.keywords:
                return ("call", n, tuple(self.sym(a, depth + 1) for a in node.args))
            if n == "len" and node.args:
                inner = node.args[0]
                if isinstance(inner, ast.Call) and self.ms.qualify(inner.func) == "os.sched_getaffinity":
                    return POSITIVE
            if n == "getattr" and len(node.args) >= 2:
                ns, attr = node.args[0], node.args[1]
                if isinstance(ns, ast.Name) and ns.id in self.ms.namespaces and isinstance(attr, ast.Constant):
                    return ("arg", str(attr.value))
            if n == "dict" and not node.args:
                return ("dict", tuple((k.arg, self.sym(k.value, depth + 1)) for k in node.keywords if k.arg)) if all(
                    k.arg for k in node.keywords
                ) else UNKNOWN
        return UNKNOWN

    # ---------------------------------------------------------------- calls into the project

    def callee_ref(self, func: ast.AST) -> tuple | None:
        summary = self.ms.summary
        if isinstance(func, ast.Name):
            n = func.id
            if n in self.nested:
                return ("fid", self.nested[n])
            if n in self.ms.top_defs or n in summary.classes or n in summary.imports:
                return ("name", n)
            return None
        if isinstance(func, ast.Attribute):
            d = _dotted(func)
            if not d:
                return None
            parts = d.split(".")
            if parts[0] == "self" and len(parts) == 2 and self.fs.cls:
                return ("self", self.fs.cls, parts[1])
            if len(parts) == 2 and parts[0] in self.instances:
                return ("inst", self.instances[parts[0]], parts[1])
            for cut in range(len(parts) - 1, 0, -1):
                if ".".join(parts[:cut]) in summary.imports:
                    return ("attr", d)
        return None


_MIXED_PRECISION_FRAMEWORKS = {
    "accelerate.Accelerator": "accelerate",
    "lightning.Trainer": "lightning",
    "lightning.pytorch.Trainer": "lightning",
    "pytorch_lightning.Trainer": "lightning",
    "transformers.TrainingArguments": "hf",
    "transformers.Seq2SeqTrainingArguments": "hf",
}

_EXPR_FIELDS: dict[type, tuple[str, ...]] = {
    ast.BinOp: ("left", "right"),
    ast.BoolOp: ("values",),
    ast.UnaryOp: ("operand",),
    ast.Compare: ("left", "comparators"),
    ast.Subscript: ("value", "slice"),
    ast.Tuple: ("elts",),
    ast.List: ("elts",),
    ast.Set: ("elts",),
    ast.Dict: ("keys", "values"),
    ast.Starred: ("value",),
    ast.Slice: ("lower", "upper", "step"),
    ast.IfExp: ("test", "body", "orelse"),
    ast.Await: ("value",),
    ast.Yield: ("value",),
    ast.YieldFrom: ("value",),
    ast.FormattedValue: ("value",),
}


def _combine(a: str | None, b: str | None) -> str | None:
    if a == "dev" or b == "dev":
        return "dev"
    if a == b:
        return a
    if {a, b} == {"host", "val"}:
        return "host"
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

"""One module's AST -> ``ModuleSummary``: the facts the checks need, with their contexts.

The scanner keeps only what every check shares, the abstract state of a script:

- ``scan.py`` (here): a module: its imports (what each name is, which names are
  project modules), its classes and functions, the lines findings quote;
- ``walk.py``: a function's statements in order: loops, ``if`` guards, every-N-steps
  code, ``no_grad`` blocks, assignments;
- ``values.py``: what the walk knows of each name: its value (a Sym, resolved later
  against the argparse defaults), where it lives (GPU, host, a Python value), whether
  it derives from a batch, whether it holds a model;
- ``calls.py``: calls: DataLoaders, training-step markers, batch copies, calls into
  the project, argparse definitions; and the hooks through which a rule records the
  facts only it needs (``gpudoctor.rules.static_api.scan.Watch``).

Nothing is imported or executed. Summaries are plain records, so that many files
are scanned in parallel processes; ``link.py`` joins them into one project.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from gpudoctor.rules.static_api.scan import dotted as _dotted
from gpudoctor.static import knowledge as K
from gpudoctor.static.sources import (
    ImportResolver,
    module_name,
    parse_source,
    read_source,
    suppressions,
)
from gpudoctor.static.summary import ClassInfo, FileError, ModuleSummary, Site
from gpudoctor.static.symbolic import UNKNOWN
from gpudoctor.static.walk import FunctionScanner


def scan_file(path: str, display: str, roots: list[str],
              text: str | None = None) -> tuple[ModuleSummary | None, FileError | None]:
    """Read, parse and scan one file (``text``: what stands in for it, ``check --fix`` between passes).
    Never raises for a problem of the file itself."""
    p = Path(path)
    err = None
    if text is None:
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
        self.namespaces: set[str] = set(K.NAMESPACE_NAMES)
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
        self.summary.classes[node.name] = ClassInfo(node.name, bases, methods, self._framework(bases))
        if any(b.split(".")[-1] in ("Module", "LightningModule") for b in bases):
            self.module_nn_classes.add(node.name)

    def _framework(self, bases: tuple[str, ...]) -> str:
        """The framework that runs a class's step methods: a base it imports from one (``L.LightningModule``),
        or a class of this module that has one."""
        for b in bases:
            head, _, rest = b.partition(".")
            q = self.aliases.get(head, head) + (f".{rest}" if rest else "")
            if q in K.FRAMEWORK_MODULES:
                return K.FRAMEWORK_MODULES[q]
            local = self.summary.classes.get(b)
            if local is not None and local.framework:
                return local.framework
        return ""

    def queue_function(self, node: ast.AST, fid: str, cls: str | None, nested: dict[str, str]) -> None:
        self.pending.append((node, fid, cls, nested))

    def _keep_lines(self) -> None:
        wanted: set[int] = set()
        for fs in self.summary.functions.values():
            for item in (*fs.transfers, *fs.loaders, *(f for f in fs.facts if f.kind != "cuda")):
                wanted.update(range(item.site.line, min(item.site.end_line, item.site.line + 12) + 1))
            for loop in fs.loops:  # the header and the first lines of the body (fix snippets)
                wanted.update(range(loop.site.line, loop.site.end_line + 3))
            for marker in fs.markers:
                wanted.add(marker.site.line)
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

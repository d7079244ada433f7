"""What a rule asks the scanner to record for it: a ``Watch`` of hooks, and the ``Scan`` they call.

The scanner walks every function once, keeping the shared state (names, values,
places, loops, guards). It records the facts every check shares itself (loops,
training-step markers, DataLoader constructions, batch copies, "cuda", "compile",
"jit"); a fact that only one rule needs is recorded by that rule's hooks. A rule
lists them in a ``Watch``:

- ``calls``: a qualified name (``torch.cuda.empty_cache``, as import-resolved) →
  ``hook(scan, node, qualname)``. The call is then the rule's: the scanner's own
  fallback for it ("any ``torch.cuda.*`` call means CUDA") does not apply.
- ``call_patterns``: ``hook(scan, node, qualname) -> bool`` for names a table cannot
  list (``torchvision.models.resnet50``, any ``torch.optim`` optimizer); True when the
  call was the rule's. Tried in order after ``calls``, until one says True.
- ``methods``: a method name → ``hook(scan, node, receiver)`` (``.item()``, ``.cpu()``).
- ``builtins``: a builtin called by name → ``hook(scan, node)`` (``print``, ``float``).
- ``settings``: a qualified attribute assigned → ``hook(scan, target, value, qualname)``
  (``torch.backends.cudnn.benchmark = True``).
- ``formatted``: ``hook(scan, value)`` for each value an f-string formats.
- ``loops``: ``hook(scan, node, loop)`` as each loop starts, before its body is walked.
- ``tests``: ``hook(scan, test)`` for the test of each ``if``, ``while``, ``assert`` and
  conditional expression (``x if test else y``), in the context around the statement.

A hook reads the state through ``Scan`` (where a value lives, what the source says it
is) and keeps what it found with ``scan.record(kind, node, …)``: a ``Fact`` of that kind
in the function's summary, with the context of the node (loops, guards, no_grad).
Hooks run in the scanner's worker processes: what they record must pickle (plain
values, Syms), and they must not keep state of their own.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpudoctor.rules.static_api.facts import Loop, Site, Sym


class Scan(Protocol):
    """The scanner, as a hook sees it, at the node it was called for."""

    modules: set[str]  # names that hold a module (a model, a loss), as the walk has seen so far
    eval_receivers: set[str]  # names whose ``.eval()`` is in effect at this point
    framework: str  # the framework that runs the walked method's class (``names.LIGHTNING`` …), else ""

    def qualify(self, node: ast.AST) -> str | None:
        """The import-resolved dotted name of an expression (``nn.Conv2d`` → ``torch.nn.Conv2d``), or None."""
        ...

    def imported(self, name: str) -> str | None:
        """What a name of the module was imported as (``np`` → ``numpy``), or None."""
        ...

    def sym(self, node: ast.AST | None) -> Sym:
        """What the source says a value is (``UNKNOWN`` for None or anything it cannot tell)."""
        ...

    def place(self, node: ast.AST) -> str | None:
        """Where a value lives if it is a tensor: "dev" (may be on the GPU), "host", "val" (a Python value), None."""
        ...

    def is_module_ref(self, node: ast.AST) -> bool:
        """Whether an expression names a module (model, loss): by construction, by name, or called in the function."""
        ...

    def is_local(self, name: str) -> bool:
        """Whether the function binds this name itself (a local ``print`` is not the builtin)."""
        ...

    def to_target(self, node: ast.Call) -> str | None:
        """What a ``.to(...)`` call moves to: "cpu", "cuda" (a device that may be a GPU), "dtype", or None."""
        ...

    def kwarg(self, node: ast.Call, name: str) -> ast.AST | None:
        """The value of a keyword argument of a call, or None."""
        ...

    def segment(self, node: ast.AST, limit: int = 100) -> str:
        """The expression as written (its first line), at most ``limit`` characters."""
        ...

    def source_of(self, node: ast.AST) -> str:
        """The whole source lines a node spans."""
        ...

    def record(
        self,
        kind: str,
        node: ast.AST,
        value: Sym | None = None,
        extra: str = "",
        *,
        text: str | None = None,
        data: Any = None,
        site: Site | None = None,
    ) -> None:
        """Keep a ``Fact`` of ``kind`` at ``node``, in the current context (loops, guards, no_grad).

        ``text`` defaults to ``segment(node)``, ``site`` to the node's (a loop hook passes ``loop.site``,
        the loop's header: a fact's lines are kept for quoting)."""
        ...


CallHook = Callable[[Scan, ast.Call, str], None]
CallMatcher = Callable[[Scan, ast.Call, str], bool]
MethodHook = Callable[[Scan, ast.Call, ast.expr], None]
BuiltinHook = Callable[[Scan, ast.Call], None]
SettingHook = Callable[[Scan, ast.Attribute, ast.expr, str], None]
FormatHook = Callable[[Scan, ast.expr], None]
LoopHook = Callable[[Scan, ast.stmt, Loop], None]
TestHook = Callable[[Scan, ast.expr], None]


@dataclass(frozen=True, slots=True, eq=False)
class Watch:
    """The hooks a rule adds to the scanner's walk (see the module documentation)."""

    calls: Mapping[str, CallHook] = field(default_factory=dict)
    call_patterns: tuple[CallMatcher, ...] = ()
    methods: Mapping[str, MethodHook] = field(default_factory=dict)
    builtins: Mapping[str, BuiltinHook] = field(default_factory=dict)
    settings: Mapping[str, SettingHook] = field(default_factory=dict)
    formatted: FormatHook | None = None
    loops: LoopHook | None = None
    tests: TestHook | None = None


def root_name(node: ast.AST) -> str | None:
    """The name an expression starts from (``np.float32(x).item()`` → ``np``), or None."""
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


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` as written, or None for anything that is not a dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def last(name: str | None) -> str:
    """The last part of a dotted name."""
    return name.rsplit(".", 1)[-1] if name else ""

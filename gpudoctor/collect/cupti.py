"""CUPTI torn down after each profiler window: ``TEARDOWN_CUPTI=1`` in the training process.

Kineto detaches CUPTI (``cuptiFinalize``) when a profiler session ends only where the
environment says ``TEARDOWN_CUPTI=1`` (libkineto ``CuptiActivityApi.cpp``, read with
``getenv`` at each session's end). Without it CUPTI stays attached to the process and
training runs 10-20 % slower for the rest of it (pytorch/pytorch#144455, PR #146604):
every step after gpudoctor's first window would pay it. torch itself sets
``TEARDOWN_CUPTI=0`` (and ``DISABLE_CUPTI_LAZY_REINIT=1``) where inductor's CUDA graphs
meet a CUDA build before 12.6 (``torch/profiler/profiler.py``, ``torch/__init__.py``):
CUPTI's re-initialisation after a teardown crashed with CUDA graphs there.

The rule, decided in the training process once torch is imported (its CUDA build is
known there) and before the script runs:

1. the user's environment has ``TEARDOWN_CUPTI`` (any value, a ``--verify`` trial's
   ``env`` injection too): left as it is;
2. gpudoctor records no profiler window, or torch has no CUDA (a CPU or ROCm build): no
   CUPTI to tear down, nothing set;
3. CUDA 12.6 or later: ``TEARDOWN_CUPTI=1`` (safe with CUDA graphs: torch's own rule);
4. before 12.6: the script's source is read (:func:`cuda_graph_site`, its syntax only) for
   CUDA graphs (``torch.cuda.graph``, ``CUDAGraph``, ``make_graphed_callables``,
   ``graph_pool_handle``, ``torch.compile`` with ``mode="reduce-overhead"`` or
   ``"max-autotune"``, inductor's ``cudagraphs`` option). One seen, or a source that
   could not be read: nothing set. None seen: ``TEARDOWN_CUPTI=1``, and a CUDA graph
   capture that begins at run time anyway (in a module the script imports) turns it back
   to ``0`` with ``DISABLE_CUPTI_LAZY_REINIT=1``, torch's own pair, from that moment on
   (:class:`GraphGuard`).

The variable is the process's: it holds for the script's own torch.profiler sessions too (their
end detaches CUPTI as gpudoctor's windows' do). The decision is recorded in the manifest
(``collected``, name ``cupti_teardown``).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

ENV = "TEARDOWN_CUPTI"
LAZY_REINIT_ENV = "DISABLE_CUPTI_LAZY_REINIT"
SAFE_WITH_GRAPHS = (12, 6)  # torch: `cuda_version < "12.6"` keeps CUPTI attached with CUDA graphs
_GRAPH_NAMES = frozenset({"CUDAGraph", "make_graphed_callables", "graph_pool_handle"})
_GRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})  # torch.compile modes that capture CUDA graphs


@dataclass(frozen=True, slots=True)
class Decision:
    """What gpudoctor set (``value``: ``"1"``; None: the environment left as it was) and why."""

    value: str | None
    why: str
    guard: bool = False  # a CUDA graph capture at run time turns it off (CUDA before 12.6)


def cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"12.4"`` → (12, 4); None for a torch without CUDA or a version not of that form."""
    parts = str(text or "").split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def decide(environ: Mapping[str, str], cuda: str | None, profiling: bool,
           graph_site: Callable[[], str | None]) -> Decision:
    """The rule of the module docstring; ``graph_site`` reads the source (only before CUDA 12.6):
    ``"file:line"`` of a CUDA graph, ``""`` for none seen, None when it could not be read."""
    if ENV in environ:
        return Decision(None, f"set by the user ({ENV}={environ[ENV]}): left as it is")
    if not profiling:
        return Decision(None, "gpudoctor records no torch.profiler window in this run")
    if not cuda:
        return Decision(None, "this torch has no CUDA (a CPU or ROCm build): no CUPTI to tear down")
    version = cuda_version(cuda)
    if version is None:
        return Decision(None, f"CUDA version {cuda!r} not understood: {ENV} left unset")
    after = "CUPTI is detached (cuptiFinalize) at the end of each profiler window"
    if version >= SAFE_WITH_GRAPHS:
        return Decision("1", f"{after}; CUDA {cuda} ≥ 12.6: safe with CUDA graphs")
    site = graph_site()
    if site is None:
        return Decision(None, f"CUDA {cuda} < 12.6 and the script's source could not be read for CUDA graphs "
                              "(CUPTI's re-initialisation after a teardown crashes with them): left unset")
    if site:
        return Decision(None, f"the script uses CUDA graphs ({site}) and CUDA {cuda} < 12.6: CUPTI's "
                              "re-initialisation after a teardown crashes with them (torch's own rule): left unset")
    return Decision("1", f"{after}; CUDA {cuda} < 12.6 and no CUDA graph in the script's source "
                         "(a capture at run time turns it off)", guard=True)


def apply(decision: Decision, environ: MutableMapping[str, str]) -> None:
    if decision.value is not None:
        environ[ENV] = decision.value


def cuda_graph_site(source: str | bytes, filename: str) -> str:
    """``"file:line"`` of the first CUDA graph the source's syntax shows, ``""`` when none;
    SyntaxError and ValueError pass on (the caller counts the source as unread)."""
    tree = ast.parse(source, filename)
    hits = sorted(n.lineno for n in ast.walk(tree) if _is_graph_use(n))
    return f"{os.path.basename(filename)}:{hits[0]}" if hits else ""


def _is_graph_use(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute):
        if node.attr in _GRAPH_NAMES or node.attr == "cudagraphs":
            return True
        base = node.value
        return node.attr == "graph" and (isinstance(base, ast.Name) and base.id == "cuda"
                                         or isinstance(base, ast.Attribute) and base.attr == "cuda")
    if isinstance(node, ast.ImportFrom) and node.module in ("torch.cuda", "torch.cuda.graphs"):
        return any(a.name in _GRAPH_NAMES or a.name == "graph" for a in node.names)
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name != "compile":
            return False
        for kw in node.keywords:
            if kw.arg == "mode" and isinstance(kw.value, ast.Constant) and kw.value.value in _GRAPH_MODES:
                return True
            if kw.arg == "options" and isinstance(kw.value, ast.Dict):
                return any(isinstance(k, ast.Constant) and k.value == "triton.cudagraphs" for k in kw.value.keys)
    return False


def read_graph_site(path: str | None) -> str | None:
    """:func:`cuda_graph_site` of the file at ``path``; None when it cannot be read or parsed."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            return cuda_graph_site(fh.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


class GraphGuard:
    """CUDA before 12.6 with ``TEARDOWN_CUPTI=1`` set by gpudoctor: the first CUDA graph capture
    (``torch.cuda.CUDAGraph.capture_begin``, which ``torch.cuda.graph``, ``make_graphed_callables``
    and inductor's CUDA graph trees go through) sets ``TEARDOWN_CUPTI=0`` and
    ``DISABLE_CUPTI_LAZY_REINIT=1`` before it runs, unless the script changed them meanwhile."""

    def __init__(self, graph_cls: Any, environ: MutableMapping[str, str], current_step: Callable[[], int]) -> None:
        self.graph_cls = graph_cls
        self.environ = environ
        self.current_step = current_step
        self.turned_off_at: int | None = None  # the step at which a capture turned teardown off
        self._original: Any = None

    def install(self) -> str:
        """"" once in place, else why not."""
        original = getattr(self.graph_cls, "capture_begin", None)
        if original is None:
            return "torch.cuda.CUDAGraph has no capture_begin"
        guard = self

        def capture_begin(graph: Any, *args: Any, **kwargs: Any) -> Any:
            guard.on_capture()
            return original(graph, *args, **kwargs)

        capture_begin.__wrapped__ = original  # type: ignore[attr-defined]
        self._original = original
        self.graph_cls.capture_begin = capture_begin
        return ""

    def on_capture(self) -> None:
        if self.turned_off_at is not None or self.environ.get(ENV) != "1":
            return
        self.environ[ENV] = "0"
        self.environ.setdefault(LAZY_REINIT_ENV, "1")
        try:
            self.turned_off_at = int(self.current_step())
        except Exception:
            self.turned_off_at = -1

    def note(self) -> str:
        if self.turned_off_at is None:
            return ""
        where = f"at step {self.turned_off_at}" if self.turned_off_at >= 0 else "during the run"
        return f"a CUDA graph capture began {where}: {ENV}=0 from then on (CUDA < 12.6)"

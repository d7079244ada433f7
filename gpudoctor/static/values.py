"""The abstract state of a function's walk: where values live, what they are, what derives from a batch.

``Values`` is the half of ``FunctionScanner`` (``walk.py``) that answers questions
about expressions from the state the walk keeps per name:

- ``values``: its *Sym* (``symbolic.py``): the value when the source fixes it,
  ``args.x`` references, ``torch.cuda.is_available()`` …;
- ``places``: where it lives when it is a tensor: ``"dev"`` (may live on the GPU:
  a model's output, a ``.to(device)`` result, a loss), ``"host"`` (a batch fresh
  from a DataLoader, a ``.cpu()`` result) or ``"val"`` (a Python value);
- ``taint`` / ``derived``: whether it derives from a batch (a loop target over a
  DataLoader, ``next(it)``, a parameter): only those ``.to(device)`` calls are batch
  copies;
- ``modules``: whether it holds a module (model, loss).

Its public methods are the ``Scan`` a rule's hooks see (``gpudoctor.rules.static_api.scan``).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from gpudoctor.rules.static_api.facts import Fact, Site
from gpudoctor.rules.static_api.names import COMPILE, DATA_PARALLEL, DDP, MODEL_NAME
from gpudoctor.rules.static_api.scan import dotted as _dotted
from gpudoctor.rules.static_api.scan import last as _last
from gpudoctor.static import knowledge as K
from gpudoctor.static.symbolic import POSITIVE, UNKNOWN, Sym, const

_DTYPES = frozenset(
    {"float16", "half", "bfloat16", "float32", "float", "float64", "double", "int64", "long", "int32", "int",
     "int16", "short", "int8", "uint8", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"}
)
_CMP_OPS = {
    ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=",
    ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not",
}
_BIN_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Div: "/", ast.Mod: "%"}
_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_SYM_DEPTH = 12
_MAX_CUDA_FACTS = 2
_MAX_CUDA_MAYBE = 6


class Values:
    """Questions about expressions, answered from the walk's state (see the module documentation)."""

    # ---------------------------------------------------------------- the Scan of the rules' hooks

    def qualify(self, node: ast.AST) -> str | None:
        return self.ms.qualify(node)

    def imported(self, name: str) -> str | None:
        return self.ms.aliases.get(name)

    def is_local(self, name: str) -> bool:
        return name in self.values

    def kwarg(self, node: ast.Call, name: str) -> ast.AST | None:
        return self._kwnode(node, name)

    def to_target(self, node: ast.Call) -> str | None:
        return self._to_target(node)

    def is_module_ref(self, node: ast.AST) -> bool:
        return self._is_module_ref(node)

    def segment(self, node: ast.AST, limit: int = 100) -> str:
        return self.ms.segment(node, limit)

    def source_of(self, node: ast.AST) -> str:
        return self.ms.text_of(node)

    def record(
        self, kind: str, node: ast.AST, value: Sym | None = None, extra: str = "", *, text: str | None = None,
        data: Any = None, site: Site | None = None,
    ) -> None:
        self.fs.facts.append(
            Fact(
                kind,
                self.ms.site(node) if site is None else site,
                self.ctx(),
                value,
                self.ms.segment(node) if text is None else text,
                extra,
                data,
            )
        )

    def fact(self, kind: str, node: ast.AST, value: Sym | None = None, extra: str = "") -> None:
        """A shared fact ("cuda", "compile", "jit").

        A "cuda" fact's value is the device it names, when a setting decides it (``.to(device)``, a
        Trainer's ``accelerator``): the linker resolves it, and a CPU device is not CUDA. At most
        ``_MAX_CUDA_FACTS`` per function that need nothing resolved (no value, no ``if`` around them:
        one is enough), and ``_MAX_CUDA_MAYBE`` that do."""
        if kind == "cuda":
            certain = value is None and not self.guards
            if certain and self.cuda_facts >= _MAX_CUDA_FACTS or not certain and self.cuda_maybe >= _MAX_CUDA_MAYBE:
                return
            if certain:
                self.cuda_facts += 1
            else:
                self.cuda_maybe += 1
        self.fs.facts.append(Fact(kind, self.ms.site(node), self.ctx(), value, self.ms.segment(node), extra))

    # ---------------------------------------------------------------- devices

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
            if q in K.ACCELERATOR_DEVICE:
                return "cuda"
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

    # ---------------------------------------------------------------- batches and modules

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

    def _is_module_ref(self, node: ast.AST) -> bool:
        """A model or loss module: by construction, by name, or because the function calls it."""
        d = _dotted(node)
        if not d:
            return False
        if d in self.modules or MODEL_NAME.match(_last(d)):
            return True
        if self._called is None:  # a tensor is never called: a called name is a module or a function
            self._called = set(_CALLEE.findall(self.ms.text_of(self.node)))
        return d in self._called

    def _is_model_call(self, node: ast.Call) -> bool:
        d = _dotted(node.func)
        if not d:
            return False
        if self.framework and d in ("self", "self.forward"):
            return True  # a LightningModule is the model: self(x) runs its forward
        if d in self.modules or d in self.eval_receivers:
            return True
        if MODEL_NAME.match(_last(d)) and not self.ms.qualify(node.func):
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
            if q.startswith("torch.nn.") and last[:1].isupper() and q not in DATA_PARALLEL:
                return True
            if q in DATA_PARALLEL or q in DDP or q in COMPILE or q.startswith("torchvision.models."):
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

    # ---------------------------------------------------------------- places

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

    # ---------------------------------------------------------------- values

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
            if isinstance(base, ast.Name) and base.id == "self" and self.fs.cls:
                return ("attr", self.ms.spath, self.fs.cls, node.attr)  # what the class assigns it
            if isinstance(base, ast.Attribute) and base.attr in self.ms.namespaces:
                return ("arg", node.attr)
            if node.attr == "type":
                inner = self.sym(base, depth + 1)
                if inner is not UNKNOWN:
                    return ("devtype", inner)
            if node.attr == "device":  # `src.device`: where that tensor is, not a device chosen here
                return ("devof",)
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
        if q in K.CUDA_AVAILABLE or q in K.ACCELERATOR_AVAILABLE:
            return ("cuda",)
        if q in K.ACCELERATOR_DEVICE:
            return const("cuda")  # judged on a CUDA machine
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


def _combine(a: str | None, b: str | None) -> str | None:
    if a == "dev" or b == "dev":
        return "dev"
    if a == b:
        return a
    if {a, b} == {"host", "val"}:
        return "host"
    return None

"""Expressions and calls of a function's walk: the scanner's own call facts, and the rules' hooks.

``Calls`` is the half of ``FunctionScanner`` (``walk.py``) that walks expressions.
At each call it records what every check shares: DataLoader constructions
(``LoaderFact``), training-step markers (``.backward()``, ``optimizer.step()``), batch
copies to the device (``Transfer``), calls into the project (the call graph), argparse
definitions, "cuda" / "compile" / "jit" facts. Everything else is a rule's: the
scanner calls the hooks of the rules' ``Watch``es (``gpudoctor.rules.static_api.scan``),
composed once per process by ``hooks()``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from gpudoctor.rules.static_api.names import (
    COMPILE,
    HF_TRAINER,
    HF_TRAINERS,
    HF_TRAINING_ARGS,
    LIGHTNING_TRAINERS,
)
from gpudoctor.rules.static_api.scan import (
    BuiltinHook,
    CallHook,
    CallMatcher,
    FormatHook,
    LoopHook,
    MethodHook,
    SettingHook,
    TestHook,
)
from gpudoctor.rules.static_api.scan import dotted as _dotted
from gpudoctor.rules.static_api.scan import last as _last
from gpudoctor.static import knowledge as K
from gpudoctor.static.summary import Call, LoaderFact, Marker, Transfer
from gpudoctor.static.symbolic import UNKNOWN, ArgDef, Sym, const
from gpudoctor.static.values import _MAX_CUDA_FACTS

_CUDA_STR = re.compile(r"^(cuda(:\d+)?|nccl|gpu)$")


# --------------------------------------------------------------------------- the rules' hooks


@dataclass(slots=True)
class Hooks:
    """Every rule's ``Watch``, merged: per name, the hooks in rule-code order."""

    calls: dict[str, list[CallHook]] = field(default_factory=dict)
    call_patterns: list[CallMatcher] = field(default_factory=list)
    methods: dict[str, list[MethodHook]] = field(default_factory=dict)
    builtins: dict[str, list[BuiltinHook]] = field(default_factory=dict)
    settings: dict[str, list[SettingHook]] = field(default_factory=dict)
    formatted: list[FormatHook] = field(default_factory=list)
    loops: list[LoopHook] = field(default_factory=list)
    tests: list[TestHook] = field(default_factory=list)


#: Calls the scanner handles itself: a rule's hook on one of them would never run.
_OWN_CALLS = K.DATALOADERS | COMPILE | K.JIT | {"torch.autograd.backward"}


@cache
def hooks() -> Hooks:
    """The hooks of every rule with a static part (once per process; worker processes build their own)."""
    from gpudoctor.rules.registry import all_rules

    merged = Hooks()
    for rule in all_rules():
        w = rule.static.watch if rule.static is not None else None
        if w is None:
            continue
        for q, hook in w.calls.items():
            if q in _OWN_CALLS:
                raise RuntimeError(f"{rule.code}: the scanner handles {q} itself; read its shared facts instead")
            merged.calls.setdefault(q, []).append(hook)
        merged.call_patterns.extend(w.call_patterns)
        for table, mine in ((w.methods, merged.methods), (w.builtins, merged.builtins), (w.settings, merged.settings)):
            for name, hook in table.items():
                mine.setdefault(name, []).append(hook)
        if w.formatted is not None:
            merged.formatted.append(w.formatted)
        if w.loops is not None:
            merged.loops.append(w.loops)
        if w.tests is not None:
            merged.tests.append(w.tests)
    return merged


# --------------------------------------------------------------------------- expressions


class Calls:
    """Expressions and calls (see the module documentation)."""

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
                    for hook in self.hooks.formatted:
                        hook(self, v.value)
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
            for hook in self.hooks.tests:
                hook(self, node.test)
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

    def call(self, node: ast.Call) -> None:
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
            own = _OWN_METHODS.get(meth)
            if own is not None:
                own(self, node, recv)
            for hook in self.hooks.methods.get(meth, ()):
                hook(self, node, recv)
        elif isinstance(func, ast.Name):
            for hook in self.hooks.builtins.get(func.id, ()):
                hook(self, node)
        ref = self.callee_ref(func)
        if ref is not None:
            assigned: tuple[str | None, ...] = ()
            if self.pending_assign and self.pending_assign[0] == id(node):
                assigned = self.pending_assign[1]
            args = tuple(UNKNOWN if isinstance(a, ast.Starred) else self.sym(a) for a in node.args)
            kwargs = tuple((k.arg, self.sym(k.value)) for k in node.keywords if k.arg)
            self.fs.calls.append(Call(ref, self.ms.site(node), self.ctx(), args, kwargs, assigned))

    def _qualified_call(self, node: ast.Call, q: str) -> None:
        """A call of a library function (``q`` as import-resolved): the scanner's own, then the rules'.

        A ``torch.cuda.*`` call that no rule claims is CUDA in use."""
        if q in K.DATALOADERS:
            self.loader(node)
            return
        if q in COMPILE:
            self.fact("compile", node)
            return
        if q in K.JIT:
            self.fact("jit", node)
            return
        if q == "torch.autograd.backward":
            self.marker("backward", node)
            return
        self._framework_device(node, q)
        mine = self.hooks.calls.get(q)
        if mine is not None:
            for hook in mine:
                hook(self, node, q)
            return
        for matcher in self.hooks.call_patterns:
            if matcher(self, node, q):
                return
        if q.startswith("torch.cuda.") and q not in K.CUDA_QUERIES:
            self.fact("cuda", node)

    def _framework_device(self, node: ast.Call, q: str) -> None:
        """A framework that places the model on the accelerator it finds: CUDA in use, unless its
        arguments ask for the CPU (``Trainer(accelerator="cpu")``, ``Accelerator(cpu=True)``)."""
        if q in K.ACCELERATORS or q in HF_TRAINING_ARGS:
            flag = next((v for k in ("cpu", "use_cpu", "no_cuda") if (v := self._kwnode(node, k)) is not None), None)
            self.fact("cuda", node, ("not", self.sym(flag)) if flag is not None else None)
            compiled = self._kwnode(node, "torch_compile") if q in HF_TRAINING_ARGS else None
            if compiled is not None:
                self.fact("compile", node, self.sym(compiled))  # the Trainer compiles the model
            if q in HF_TRAINING_ARGS and not any(k.arg is None for k in node.keywords):  # **kwargs: not known
                # the Trainer's DataLoaders, which it builds with ``dataloader_num_workers`` (GD201, the checklist)
                workers = self._kwnode(node, "dataloader_num_workers")
                self.record("hf_loader", node, self.sym(workers) if workers is not None else None)
        elif q in LIGHTNING_TRAINERS:
            accelerator = self._kwnode(node, "accelerator")
            self.fact("cuda", node, self.sym(accelerator) if accelerator is not None else const("auto"))
        elif q in HF_TRAINERS:
            self.fact("trainer", node, extra=HF_TRAINER)  # Trainer.train() runs the loop

    # ---------------------------------------------------------------- the scanner's own methods

    def _backward_call(self, node: ast.Call, recv: ast.expr) -> None:
        self.marker("backward", node)

    def _step_call(self, node: ast.Call, recv: ast.expr) -> None:
        d = _dotted(recv) or ""
        last = _last(d)
        if (
            d in self.optimizer_vars
            or (last and K.OPTIMIZER_NAME.match(last))
            or (last and K.SCALER_NAME.search(last) and node.args)
        ):
            self.marker("optimizer.step", node)

    def _eval_call(self, node: ast.Call, recv: ast.expr) -> None:
        if not node.args:
            d = _dotted(recv)
            if d:
                self.eval_receivers.add(d)

    def _train_call(self, node: ast.Call, recv: ast.expr) -> None:
        d = _dotted(recv)
        if d:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and arg.value is False:
                self.eval_receivers.add(d)
            else:
                self.eval_receivers.discard(d)

    def _add_argument_call(self, node: ast.Call, recv: ast.expr) -> None:
        self.argument(node)

    def _set_defaults_call(self, node: ast.Call, recv: ast.expr) -> None:
        for k in node.keywords:
            if k.arg:
                self.ms.summary.arg_overrides[k.arg] = self.sym(k.value)

    def _dict_update_call(self, node: ast.Call, recv: ast.expr) -> None:
        if isinstance(recv, ast.Name) and len(node.args) == 1 and not node.keywords:
            # kwargs.update(cuda_kwargs): the merged dict, when the enclosing `if` tests hold
            prev = self.values.get(recv.id, UNKNOWN)
            merged = ("merge", prev, self.sym(node.args[0]))
            if self.guards:
                conds = tuple(g if polarity else ("not", g) for g, polarity in self.guards)
                merged = ("if", ("and", conds), merged, prev)
            self.values[recv.id] = merged
        elif isinstance(recv, ast.Name):
            self.values[recv.id] = UNKNOWN

    def _dict_change_call(self, node: ast.Call, recv: ast.expr) -> None:
        if isinstance(recv, ast.Name):
            self.values[recv.id] = UNKNOWN

    def _to_call(self, node: ast.Call, recv: ast.expr) -> None:
        if self._to_target(node) == "cuda":
            dev = self._kwnode(node, "device") or (node.args[0] if node.args else None)
            named = dev is not None and not isinstance(dev, ast.Constant)
            self.fact("cuda", node, self.sym(dev) if named else None)  # `device` may resolve to "cpu"
            self._transfer(node, recv, ".to")

    def _cuda_call(self, node: ast.Call, recv: ast.expr) -> None:
        self.fact("cuda", node)
        self._transfer(node, recv, ".cuda")

    # ---------------------------------------------------------------- shared facts

    #: DataLoader arguments a worker process receives pickled (by position: DataLoader's signature)
    _SENT_TO_WORKERS = (("sampler", 3), ("batch_sampler", 4), ("collate_fn", 6), ("worker_init_fn", 10))

    def _unpicklable(self, node: ast.Call, dataset: ast.AST | None) -> str:
        """``LoaderFact.unpicklable``: the first argument a spawned worker could not unpickle, and why."""
        args = [("dataset", dataset)]
        for name, pos in self._SENT_TO_WORKERS:
            value = self._kwnode(node, name)
            if value is None and pos < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[:pos + 1]):
                value = node.args[pos]
            args.append((name, value))
        for name, value in args:
            why = self.not_picklable(value) if value is not None else ""
            if why:
                return f"its {name} (`{self.ms.segment(value, 40)}`) is {why}"
        return ""

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
            dataset=(_dotted(dataset) or "") if dataset is not None else "",
            unpicklable=self._unpicklable(node, dataset),
        )
        self.fs.loaders.append(fact)
        self.loader_nodes[id(node)] = fact

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


_OWN_METHODS: dict[str, Callable[[Calls, ast.Call, ast.expr], None]] = {
    "backward": Calls._backward_call,
    "step": Calls._step_call,
    "eval": Calls._eval_call,
    "train": Calls._train_call,
    "add_argument": Calls._add_argument_call,
    "set_defaults": Calls._set_defaults_call,
    "update": Calls._dict_update_call,
    "setdefault": Calls._dict_change_call,
    "pop": Calls._dict_change_call,
    "clear": Calls._dict_change_call,
    "to": Calls._to_call,
    "cuda": Calls._cuda_call,
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

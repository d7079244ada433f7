"""Joins the module summaries into one project: calls across functions and files, training loops.

Definitions (documented for users in ``gpudoctor/static/__init__.py``):

- a function *trains* when it calls ``.backward()`` / ``optimizer.step()`` itself or
  calls a project function that trains;
- a loop *contains training* when such a marker, or a call to a training function,
  is inside it; it is a **step loop** when no loop inside it (and no function it
  calls) contains training, else an **epoch loop**;
- a function is **per step** when a step loop calls it (not under ``if i % N == 0``),
  when a per-step function calls it, or when it is a framework's ``training_step``;
- a **program** is an entry file (one given on the command line that no other
  given file imports) with the project modules it imports, transitively. Facts
  that judge the whole script (CUDA in use, autocast, cudnn.benchmark, pinned
  memory) are looked up in every program that contains the module in question.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable

from gpudoctor.static.summary import Call, Ctx, FuncSummary, ModuleSummary
from gpudoctor.static.symbolic import ArgDef, Resolved, Resolver, Sym

Gid = str  # "<module path>::<function id>"


class Project:
    def __init__(self, modules: dict[str, ModuleSummary], entries: Iterable[str]) -> None:
        self.modules = modules
        self.paths = sorted(modules)
        self.index = {p: i for i, p in enumerate(self.paths)}
        self.entries = [e for e in entries if e in modules]
        self.functions: dict[Gid, tuple[ModuleSummary, FuncSummary]] = {}
        for ms in modules.values():
            for fid, fs in ms.functions.items():
                self.functions[f"{ms.path}::{fid}"] = (ms, fs)
        self.edges: dict[Gid, list[tuple[Gid, Call]]] = defaultdict(list)  # caller -> (callee, call)
        self.callers: dict[Gid, list[tuple[Gid, Call]]] = defaultdict(list)  # callee -> (caller, call)
        self._callee_cache: dict[tuple[str, tuple], Gid | None] = {}
        self._link_calls()
        self.args = self._arg_table()
        self.resolver = Resolver(self.args, constant=self._constant, param=self._param, attr=self._attr)
        self.trains = self._trains()
        self.training_loops: dict[Gid, set[int]] = {}
        self.step_loops: dict[Gid, set[int]] = {}
        self.epoch_loops: dict[Gid, set[int]] = {}
        self._loop_roles()
        self.per_step = self._per_step()
        self.called_in_loop = self._called_in_loop()
        self.worlds = self._worlds()

    # ---------------------------------------------------------------- resolution

    def resolve(self, sym: Sym, file: str) -> Resolved:
        return self.resolver.resolve(sym, file)

    def active(self, ctx: Ctx, file: str) -> tuple[bool, list[str]]:
        """Whether code under these ``if`` tests runs with the argparse defaults (and why not)."""
        origins: list[str] = []
        for sym, polarity in ctx.guards:
            r = self.resolver.resolve(sym, file)
            t = r.truth()
            if t is not None and t != polarity:
                return False, r.origins
            origins.extend(r.origins)
        return True, origins

    def _arg_table(self) -> dict[str, list[ArgDef]]:
        table: dict[str, list[ArgDef]] = defaultdict(list)
        for path in self.paths:
            ms = self.modules[path]
            for d in ms.argdefs:
                if d.dest in ms.arg_overrides:
                    d = ArgDef(d.dest, d.flag, ms.arg_overrides[d.dest], d.file, d.line)
                table[d.dest].append(d)
        return dict(table)

    def _constant(self, path: str, name: str) -> Sym | None:
        ms = self.modules.get(path)
        if ms is None:
            return None
        if name in ms.constants:
            return ms.constants[name]
        imp = ms.imports.get(name)
        if imp and imp[1] and imp[0] != path:
            return ("imp", imp[0], imp[1])
        return None

    def _attr(self, sym: Sym) -> tuple[Sym, str] | None:
        """``self.name`` in a method of ``cls``: what the class (or a base class) assigns to it."""
        _, path, cls, name = sym
        ms = self.modules.get(path)
        for _depth in range(6):
            if ms is None:
                return None
            found = ms.attrs.get(f"{cls}.{name}")
            if found is not None:
                return found, ms.path
            info = ms.classes.get(cls)
            base = next((b for b in info.bases if "." not in b), None) if info is not None else None
            where = self._class(ms, base, 0) if base is not None else None
            if where is None:
                return None
            ms, cls = where
        return None

    def _param(self, sym: Sym) -> list[tuple[Sym, str]]:
        _, gid, name, index, default = sym
        out: list[tuple[Sym, str]] = []
        target = self.functions.get(gid)
        method = target is not None and target[1].cls is not None  # a call passes self implicitly
        for caller, call in self.callers.get(gid, ()):
            file = caller.split("::", 1)[0]
            kw = dict(call.kwargs)
            if name in kw:
                out.append((kw[name], file))
                continue
            i = index
            if (method or call.callee[0] in ("self", "inst")) and i >= 0:
                i -= 1
            if 0 <= i < len(call.args):
                out.append((call.args[i], file))
            elif default is not None:
                out.append((default, gid.split("::", 1)[0]))
            else:
                out.append((("?",), file))
        return out

    # ---------------------------------------------------------------- call graph

    def _link_calls(self) -> None:
        for gid, (ms, fs) in self.functions.items():
            for call in fs.calls:
                target = self.resolve_callee(ms, call.callee)
                if target is not None and target in self.functions:
                    self.edges[gid].append((target, call))
                    self.callers[target].append((gid, call))

    def resolve_callee(self, ms: ModuleSummary, ref: tuple) -> Gid | None:
        key = (ms.path, ref)
        try:
            return self._callee_cache[key]
        except KeyError:
            pass
        found = self._resolve_callee(ms, ref)
        self._callee_cache[key] = found
        return found

    def _resolve_callee(self, ms: ModuleSummary, ref: tuple) -> Gid | None:
        kind = ref[0]
        if kind == "fid":
            return f"{ms.path}::{ref[1]}"
        if kind == "name":
            return self._resolve_name(ms, ref[1], 0)
        if kind == "self":
            return self._method(ms, ref[1], ref[2], 0)
        if kind == "inst":
            cref = ref[1]
            if cref[0] == "name":
                found = self._class(ms, cref[1], 0)
                if found is not None:
                    return self._method(found[0], found[1], ref[2], 0)
            return None
        if kind == "attr":
            parts = ref[1].split(".")
            for cut in range(len(parts) - 1, 0, -1):
                imp = ms.imports.get(".".join(parts[:cut]))
                if imp and not imp[1]:
                    target = self.modules.get(imp[0])
                    rest = parts[cut:]
                    if target is None:
                        return None
                    if len(rest) == 1:
                        return self._resolve_name(target, rest[0], 1)
                    if len(rest) == 2:
                        found = self._class(target, rest[0], 1)
                        if found is not None:
                            return self._method(found[0], found[1], rest[1], 0)
                    return None
        return None

    def _resolve_name(self, ms: ModuleSummary, name: str, depth: int) -> Gid | None:
        if depth > 5:
            return None
        fs = ms.functions.get(name)
        if fs is not None and fs.cls is None and "." not in name:
            return f"{ms.path}::{name}"
        if name in ms.classes:
            return self._method(ms, name, "__init__", 0)
        imp = ms.imports.get(name)
        if imp and imp[1]:
            target = self.modules.get(imp[0])
            if target is not None and target is not ms:
                return self._resolve_name(target, imp[1], depth + 1)
        return None

    def _class(self, ms: ModuleSummary, name: str, depth: int) -> tuple[ModuleSummary, str] | None:
        if depth > 5:
            return None
        if name in ms.classes:
            return ms, name
        imp = ms.imports.get(name)
        if imp and imp[1]:
            target = self.modules.get(imp[0])
            if target is not None and target is not ms:
                return self._class(target, imp[1], depth + 1)
        return None

    def _method(self, ms: ModuleSummary, cls: str, method: str, depth: int) -> Gid | None:
        if depth > 5:
            return None
        info = ms.classes.get(cls)
        if info is None:
            return None
        fid = info.methods.get(method)
        if fid is not None:
            return f"{ms.path}::{fid}"
        for base in info.bases:
            found = self._class(ms, base.rsplit(".", 1)[-1], 0) if "." not in base else None
            if found is not None and found != (ms, cls):
                gid = self._method(found[0], found[1], method, depth + 1)
                if gid is not None:
                    return gid
        return None

    # ---------------------------------------------------------------- training structure

    def _trains(self) -> set[Gid]:
        trains = {g for g, (_, fs) in self.functions.items() if fs.markers or fs.framework_step}
        queue = deque(trains)
        while queue:
            g = queue.popleft()
            for caller, _call in self.callers.get(g, ()):
                if caller not in trains:
                    trains.add(caller)
                    queue.append(caller)
        return trains

    def _loop_roles(self) -> None:
        containing: dict[Gid, set[int]] = {}
        for g, (_, fs) in self.functions.items():
            if not fs.loops or g not in self.trains:
                continue
            ids: set[int] = {loop.id for loop in fs.loops if loop.framework}  # the framework's loop trains
            for m in fs.markers:
                ids.update(m.ctx.loops)
            for callee, call in self.edges.get(g, ()):
                if callee in self.trains:
                    ids.update(call.ctx.loops)
            if ids:
                containing[g] = ids
        self.training_loops = containing
        # functions that run a whole training loop (themselves or through calls)
        has_loop = set(containing)
        queue = deque(has_loop)
        while queue:
            g = queue.popleft()
            for caller, _call in self.callers.get(g, ()):
                if caller not in has_loop:
                    has_loop.add(caller)
                    queue.append(caller)
        for g, ids in containing.items():
            _, fs = self.functions[g]
            step: set[int] = set()
            epoch: set[int] = set()
            loops_by_id = {loop.id: loop for loop in fs.loops}
            for lid in ids:
                inner = any(
                    other != lid and lid in loops_by_id[other].ctx.loops for other in ids if other in loops_by_id
                )
                if not inner:
                    inner = any(
                        lid in call.ctx.loops and callee in has_loop and callee != g
                        for callee, call in self.edges.get(g, ())
                    )
                (epoch if inner else step).add(lid)
            self.step_loops[g] = step
            self.epoch_loops[g] = epoch
        # loops (in functions without a training loop of their own) that call a training-loop function
        for g, (_, fs) in self.functions.items():
            if not fs.loops:
                continue
            for callee, call in self.edges.get(g, ()):
                if callee in has_loop and callee != g and call.ctx.loops:
                    self.epoch_loops.setdefault(g, set()).update(
                        lid for lid in call.ctx.loops if lid not in self.step_loops.get(g, set())
                    )

    def _per_step(self) -> set[Gid]:
        per: set[Gid] = {g for g, (_, fs) in self.functions.items() if fs.framework_step}
        queue = deque(per)
        for g, steps in self.step_loops.items():
            for callee, call in self.edges.get(g, ()):
                if any(lid in steps and lid not in call.ctx.periodic for lid in call.ctx.loops):
                    if callee not in per:
                        per.add(callee)
                        queue.append(callee)
        while queue:
            g = queue.popleft()
            for callee, call in self.edges.get(g, ()):
                if not call.ctx.periodic_any and callee not in per:
                    per.add(callee)
                    queue.append(callee)
        return per

    def _called_in_loop(self) -> set[Gid]:
        seen: set[Gid] = set()
        queue: deque[Gid] = deque()
        for edges in self.edges.values():
            for callee, call in edges:
                if call.ctx.loops and callee not in seen:
                    seen.add(callee)
                    queue.append(callee)
        while queue:
            g = queue.popleft()
            for callee, _call in self.edges.get(g, ()):
                if callee not in seen:
                    seen.add(callee)
                    queue.append(callee)
        return seen

    def step_context(self, gid: Gid, ctx: Ctx) -> int | None:
        """The step loop a fact runs in every step (its id, or -1 for a per-step function), else None."""
        steps = self.step_loops.get(gid)
        if steps:
            for lid in reversed(ctx.loops):
                if lid in steps:
                    return lid if lid not in ctx.periodic else None
        if gid in self.per_step and not ctx.periodic_any:
            return -1
        return None

    # ---------------------------------------------------------------- programs

    def _worlds(self) -> list[int]:
        """For each module, the bitset of modules that share a program with it."""
        n = len(self.paths)
        children: list[list[int]] = [[] for _ in range(n)]
        imported = [False] * n
        for p, ms in self.modules.items():
            i = self.index[p]
            for target, _attr in ms.imports.values():
                j = self.index.get(target)
                if j is not None and j != i:
                    children[i].append(j)
                    imported[j] = True
        closure = _closures(children)
        entry_idx = [self.index[e] for e in self.entries]
        roots = [i for i in entry_idx if not imported[i]]
        covered = 0
        for r in roots:
            covered |= closure[r]
        for i in entry_idx:  # entries only reachable through an import cycle
            if not (covered >> i) & 1:
                roots.append(i)
                covered |= closure[i]
        worlds = [1 << i for i in range(n)]
        for r in roots:
            c = closure[r]
            bits = c
            while bits:
                low = bits & -bits
                worlds[low.bit_length() - 1] |= c
                bits ^= low
        return worlds

    def module_bits(self, predicate) -> int:
        bits = 0
        for p, ms in self.modules.items():
            if predicate(ms):
                bits |= 1 << self.index[p]
        return bits

    def world_has(self, path: str, bits: int) -> bool:
        return bool(self.worlds[self.index[path]] & bits)

    def world_modules(self, path: str) -> list[ModuleSummary]:
        w = self.worlds[self.index[path]]
        return [self.modules[p] for i, p in enumerate(self.paths) if (w >> i) & 1]


def _closures(children: list[list[int]]) -> list[int]:
    """Reachability bitsets (each node reaches itself), via Tarjan's SCCs, iteratively."""
    n = len(children)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    comp = [-1] * n
    comps: list[list[int]] = []
    counter = 0
    for start in range(n):
        if index[start] != -1:
            continue
        work = [(start, 0)]
        while work:
            v, pi = work[-1]
            if pi == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if pi < len(children[v]):
                work[-1] = (v, pi + 1)
                w = children[v][pi]
                if index[w] == -1:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
            if low[v] == index[v]:
                members = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = len(comps)
                    members.append(w)
                    if w == v:
                        break
                comps.append(members)
    # Tarjan emits components in reverse topological order: children first.
    comp_bits = [0] * len(comps)
    for ci, members in enumerate(comps):
        bits = 0
        for v in members:
            bits |= 1 << v
        for v in members:
            for w in children[v]:
                cw = comp[w]
                if cw != ci:
                    bits |= comp_bits[cw]
        comp_bits[ci] = bits
    return [comp_bits[comp[v]] for v in range(n)]

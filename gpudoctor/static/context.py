"""The static checks' ``StaticContext``, over the linked project, and the run of every rule's check.

Each rule's static check (``Rule.static.check``, in the rule's module) reads the
project through ``ProjectContext`` and reports findings with ``report``; ``run_checks``
runs them in code order. A finding here is a ``Raw``: suppression comments and the
rule selection apply later (``gpudoctor.static.check_paths``).

Severity policy of ``gpudoctor check`` (no time is measured, so the engine's
share-of-step-time scale cannot apply):

- **warning**: the source shows a cost paid in every training step (or every
  evaluation step) on a CUDA machine, whatever the model: a DataLoader without
  workers, pageable batches, blocking copies from pinned memory, a host read of a
  device value in the step, ``empty_cache()`` every step, ``nn.DataParallel`` …;
- **info**: what depends on the hardware, the data or the model, which a static
  check cannot see, or what costs once per epoch: no autocast (it pays on Tensor
  Core GPUs), ``cudnn.benchmark`` not set (it pays only for fixed shapes), workers
  re-started every epoch …

Nothing is an error: an error needs a measured share of step time.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpudoctor.model.findings import Evidence, Fix, Location, Severity
from gpudoctor.rules.static_api import (
    TENSOR_DEVICE,
    Ctx,
    Fact,
    Function,
    LoaderFact,
    Loop,
    Resolved,
    Site,
    Sized,
    StaticContext,
    Sym,
)
from gpudoctor.rules.static_api.text import dedent
from gpudoctor.static.link import Gid, Project
from gpudoctor.static.sizing import Sizing
from gpudoctor.static.symbolic import sym_dict_items

T = TypeVar("T")

ASSUMPTION = "judged as the script runs with its argparse defaults on a CUDA machine"
#: Devices a script may name that are not CUDA ("auto" and "gpu" are, on a CUDA machine).
_NOT_CUDA = ("cpu", "mps", "xla", "tpu", "hpu", "xpu", "meta")


@dataclass(slots=True)
class Raw:
    """A finding before suppression comments and rule selection."""

    code: str
    severity: Severity
    message: str
    fix: Fix
    path: str  # absolute path of the module (suppressions)
    location: Location
    span: tuple[int, int]  # lines a suppression comment may sit on
    evidence: Evidence = field(default_factory=Evidence)
    # where the fix is, when not at the finding (StaticContext.report's fix_at): its module's absolute
    # path, its location (the before/after are made there) and the lines a suppression may sit on there
    fix_path: str = ""
    fix_location: Location | None = None
    fix_span: tuple[int, int] | None = None


class ProjectContext(StaticContext):
    """``StaticContext`` over a linked ``Project``; collects the raw findings."""

    def __init__(self, project: Project, sizing: Sizing | None = None) -> None:
        self.p = project
        self.sizing = sizing or Sizing()
        self.raw: list[Raw] = []
        self.internal_errors: list[str] = []
        self._seen: set[tuple[str, str, int, int]] = set()
        self._memo: dict[str, Any] = {}
        self._by_gid: dict[Gid, Function] = {}
        for gid, (ms, fs) in project.functions.items():
            self._by_gid[gid] = Function(
                gid=gid,
                path=ms.path,
                file=ms.display,
                fid=fs.fid,
                name=fs.name,
                line=fs.line,
                loops=fs.loops,
                markers=fs.markers,
                loaders=fs.loaders,
                transfers=fs.transfers,
                facts=fs.facts,
                no_grad_decorated=fs.no_grad_decorated,
                lines=ms.lines,
            )
        self._sorted = [self._by_gid[g] for g in sorted(self._by_gid)]
        self._facts: dict[str, list[tuple[Function, Fact]]] | None = None
        self._loader_values: dict[tuple[int, str], tuple[str, Resolved | None]] = {}
        self._programs: dict[int, int] = {}
        self._program_functions: dict[int, list[Function]] = {}
        self.cuda_bits = project.module_bits(
            lambda ms: any(f.kind == "cuda" and self._on_cuda(ms.path, f) for fs in ms.functions.values() for f in fs.facts)
        )

    def _on_cuda(self, path: str, f: Fact) -> bool:
        """Whether a "cuda" fact puts work on a CUDA device with the argparse defaults: it runs, and the
        device it names (``.to(device)``, a Trainer's ``accelerator``) is not the CPU, nor the device of
        another tensor (``.to(src.device)``: it follows that tensor, wherever the script put it; the
        script's own choice of device is judged where it makes it)."""
        if not self.p.active(f.ctx, path)[0]:
            return False
        if f.value is None:
            return True
        device = self.p.resolve(f.value, path).value
        if device is False or device is TENSOR_DEVICE:
            return False
        return not (isinstance(device, str) and device.lower().startswith(_NOT_CUDA))

    # ---------------------------------------------------------------- the project

    def functions(self) -> Sequence[Function]:
        return self._sorted

    def _in_program_order(self, paths: Iterable[str]) -> list[Function]:
        return [self._by_gid[f"{path}::{fid}"] for path in paths for fid in self.p.modules[path].functions]

    def facts(self, kind: str) -> list[tuple[Function, Fact]]:
        if self._facts is None:
            index: dict[str, list[tuple[Function, Fact]]] = defaultdict(list)
            for fn in self._in_program_order(self.p.paths):
                for f in fn.facts:
                    index[f.kind].append((fn, f))
            self._facts = dict(index)
        return self._facts.get(kind, [])

    def program_functions(self, fn: Function) -> list[Function]:
        program = self.program(fn)
        found = self._program_functions.get(program)
        if found is None:
            found = self._program_functions[program] = self._in_program_order(
                ms.path for ms in self.p.world_modules(fn.path)
            )
        return found

    def program(self, fn: Function) -> int:
        world = self.p.worlds[self.p.index[fn.path]]  # a bitset of modules: numbered, for small memo keys
        return self._programs.setdefault(world, len(self._programs))

    def in_program(self, fn: Function, others: Iterable[Function]) -> bool:
        bits = 0
        for other in others:
            bits |= 1 << self.p.index[other.path]
        return self.p.world_has(fn.path, bits)

    def cuda(self, fn: Function) -> bool:
        return self.p.world_has(fn.path, self.cuda_bits)

    @property
    def cuda_anywhere(self) -> bool:
        return self.cuda_bits != 0

    # ---------------------------------------------------------------- values

    def resolve(self, fn: Function, sym: Sym) -> Resolved:
        return self.p.resolve(sym, fn.path)

    def active_why(self, fn: Function, ctx: Ctx) -> tuple[bool, list[str]]:
        return self.p.active(ctx, fn.path)

    def loader_value(self, fn: Function, lf: LoaderFact, key: str) -> tuple[str, Resolved | None]:
        memo_key = (id(lf), key)
        found = self._loader_values.get(memo_key)
        if found is None:
            found = self._loader_values[memo_key] = self._loader_value(fn, lf, key)
        return found

    def _loader_value(self, fn: Function, lf: LoaderFact, key: str) -> tuple[str, Resolved | None]:
        if key in lf.kwargs:
            return "set", self.resolve(fn, lf.kwargs[key])
        for star in lf.stars:
            items, _origins = sym_dict_items(self.p.resolver, star, fn.path)
            if items is None:
                return "unknown", None
            if key in items:
                return "set", self.resolve(fn, items[key])
        return "missing", None

    def loaders(self) -> list[tuple[Function, LoaderFact]]:
        return self.memo("loaders", lambda: [
            (fn, lf) for fn in self._sorted for lf in fn.loaders if self.active(fn, lf.ctx)
        ])

    def loader_names(self, fn: Function, lf: LoaderFact) -> set[str]:
        names = set(lf.bindings)
        if lf.returned_index is not None:
            for _caller, call in self.p.callers.get(fn.gid, ()):
                if not call.assigned:
                    continue
                if lf.returned_index == -1 and len(call.assigned) == 1:
                    names.add(call.assigned[0] or "")
                elif 0 <= lf.returned_index < len(call.assigned):
                    names.add(call.assigned[lf.returned_index] or "")
        names.discard("")
        return names

    def callee(self, fn: Function, ref: tuple) -> Function | None:
        gid = self.p.resolve_callee(self.p.modules[fn.path], ref)
        if gid is None or gid not in self.p.functions:
            return None
        return self._by_gid[gid]

    def resolve_bound(
        self, target: Function, sym: Sym, caller: Function, args: tuple[Sym, ...], kwargs: tuple[tuple[str, Sym], ...]
    ) -> Resolved:
        where = target.path
        if sym[0] == "param" and sym[1] == target.gid:
            name, index, default = sym[2], sym[3], sym[4]
            bound = dict(kwargs)
            if name in bound:
                sym, where = bound[name], caller.path
            elif 0 <= index < len(args):
                sym, where = args[index], caller.path
            elif default is not None:
                sym = default
        return self.p.resolve(sym, where)

    # ---------------------------------------------------------------- training structure

    def step_loop(self, fn: Function, ctx: Ctx) -> int | None:
        return self.p.step_context(fn.gid, ctx)

    def step_loop_ids(self, fn: Function) -> list[int]:
        return sorted(self.p.step_loops.get(fn.gid, ()))

    def epoch_loop_ids(self, fn: Function) -> list[int]:
        return sorted(self.p.epoch_loops.get(fn.gid, ()))

    def training_loop_ids(self, fn: Function) -> set[int]:
        return self.p.training_loops.get(fn.gid, set())

    def step_loops(self) -> list[tuple[Function, Loop]]:
        def compute() -> list[tuple[Function, Loop]]:
            out = []
            for fn in self._sorted:
                for lid in self.step_loop_ids(fn):
                    loop = self.loop(fn, lid)
                    if loop is not None and self.active(fn, loop.ctx):
                        out.append((fn, loop))
            return out

        return self.memo("step-loops", compute)

    def per_step(self, fn: Function) -> bool:
        return fn.gid in self.p.per_step

    def called_in_loop(self, fn: Function) -> bool:
        return fn.gid in self.p.called_in_loop

    def callers(self, fn: Function) -> list[tuple[Function, Ctx]]:
        return [(self._by_gid[caller], call.ctx) for caller, call in self.p.callers.get(fn.gid, [])]

    def program_trains(self, fn: Function) -> bool:
        training = self.memo("training-modules", lambda: self.p.module_bits(
            lambda ms: any(f"{ms.path}::{fid}" in self.p.step_loops for fid in ms.functions)
        ))
        return self.p.world_has(fn.path, training)

    # ---------------------------------------------------------------- findings

    def source(self, fn: Function, site: Site, max_lines: int = 8) -> str:
        lines = [fn.lines.get(i, "") for i in range(site.line, min(site.end_line, site.line + max_lines - 1) + 1)]
        return dedent("\n".join(lines))

    def report(
        self,
        code: str,
        severity: Severity,
        message: str,
        fix: Fix,
        fn: Function,
        site: Site,
        evidence: Evidence | None = None,
        fix_at: tuple[Function, Site] | None = None,
    ) -> None:
        key = (code, fn.path, site.line, site.col) + ((fix_at[0].path, fix_at[1].line, fix_at[1].col) if fix_at else ())
        if key in self._seen:
            return
        self._seen.add(key)
        notes = tuple(dict.fromkeys((*(evidence.notes if evidence else ()), ASSUMPTION)))
        ev = Evidence(
            metrics=evidence.metrics if evidence else (),
            settings=evidence.settings if evidence else (),
            notes=notes,
        )
        raw = Raw(code, severity, message, fix, fn.path, self.location(fn, site), (site.line, site.end_line), ev)
        if fix_at is not None:
            ffn, fsite = fix_at
            raw.fix_path, raw.fix_location = ffn.path, self.location(ffn, fsite)
            raw.fix_span = (fsite.line, fsite.end_line)
        self.raw.append(raw)

    def sized(self, key: str, fn: Function, site: Site) -> Sized:
        return self.sizing.sized(key, fn.path, site.line, site.end_line)

    def memo(self, key: str, compute: Callable[[], T]) -> T:
        try:
            return self._memo[key]
        except KeyError:
            value = self._memo[key] = compute()
            return value


def run_checks(project: Project, sizing: Sizing | None = None) -> ProjectContext:
    """Every rule's static check over the project, in code order; a check that crashes is one error line."""
    from gpudoctor.rules.registry import all_rules

    ctx = ProjectContext(project, sizing)
    for rule in all_rules():
        check = rule.static.check if rule.static is not None else None
        if check is None:
            continue
        try:
            check(ctx)
        except Exception as err:  # noqa: BLE001 - a bug in one check must not take the others down
            if os.environ.get("GPUDOCTOR_DEBUG"):
                raise
            ctx.internal_errors.append(
                f"{rule.code} (static check): internal error in gpudoctor check ({type(err).__name__}: {err}); "
                "please report it"
            )
    return ctx

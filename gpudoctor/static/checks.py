"""The static checks: linked project facts -> findings (before suppression and selection).

Severity policy of ``gpudoctor check`` (no time is measured, so the engine's
share-of-step-time scale cannot apply):

- **warning**: the source shows a cost paid in every training step (or every
  evaluation step) on a CUDA machine, whatever the model: a DataLoader without
  workers (GD201), workers each given every core's worth of intra-op threads
  (GD204), pageable batches (GD301), blocking copies from pinned memory
  (GD302), a host read of a device value in the step (GD102, GD303),
  ``empty_cache()`` every step (GD502), ``nn.DataParallel`` (GD601), an
  evaluation loop recording autograd (GD701), an optimizer forced onto its
  for-loop implementation (GD404);
- **info**: what depends on the hardware, the data or the model, which a static
  check cannot see, or what costs once per epoch: no autocast (GD401, it pays
  on Tensor Core GPUs), the deprecated ``torch.cuda.amp`` spelling (GD401),
  ``cudnn.benchmark`` not set (GD403, it pays only for fixed shapes), the default
  ``foreach`` optimizer where ``fused`` exists (GD404), workers re-started every
  epoch (GD202), ``empty_cache()`` in a loop that is not a step loop (GD502).

Nothing is an error: an error needs a measured share of step time.
"""

from __future__ import annotations

import ast
import os
import re
import textwrap
from dataclasses import dataclass, field

from gpudoctor.model.findings import Evidence, Fix, Location, SettingRef, Severity
from gpudoctor.static import knowledge as K
from gpudoctor.static.link import Gid, Project
from gpudoctor.static.summary import Ctx, FuncSummary, LoaderFact, Loop, ModuleSummary, Site
from gpudoctor.static.symbolic import POSITIVE_VALUE, Resolved, Sym, sym_dict_items

#: Every code ``gpudoctor check`` can report.
STATIC_CODES = ("GD102", "GD201", "GD202", "GD204", "GD301", "GD302", "GD303", "GD401", "GD403", "GD404", "GD502", "GD601", "GD701")

ASSUMPTION = "judged as the script runs with its argparse defaults on a CUDA machine"


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


@dataclass(slots=True)
class Observations:
    """What the checklist needs besides the findings."""

    files: int = 0
    cuda: bool = False
    loaders: list[tuple[Location, dict[str, str]]] = field(default_factory=list)  # loc, resolved settings
    step_loops: list[Location] = field(default_factory=list)
    eval_loops: list[Location] = field(default_factory=list)
    eval_loops_guarded: int = 0
    transfers: int = 0
    transfers_non_blocking: int = 0
    pinned: list[Location] = field(default_factory=list)
    autocast: list[Location] = field(default_factory=list)
    conv: list[Location] = field(default_factory=list)
    benchmark_on: list[Location] = field(default_factory=list)
    deterministic: list[Location] = field(default_factory=list)
    compile: list[Location] = field(default_factory=list)
    jit: list[Location] = field(default_factory=list)
    tf32: list[Location] = field(default_factory=list)
    ddp: list[Location] = field(default_factory=list)
    optimizers: list[tuple[Location, str]] = field(default_factory=list)  # loc, "AdamW (fused=True)"
    batch_sizes: list[str] = field(default_factory=list)


class Checker:
    def __init__(self, project: Project) -> None:
        self.p = project
        self.raw: list[Raw] = []
        self.internal_errors: list[str] = []
        self._transfer_memo: dict[int, str] = {}
        self.obs = Observations(files=len(project.modules))
        self._seen: set[tuple[str, str, int, int]] = set()
        self.cuda_bits = project.module_bits(lambda ms: any(f.kind == "cuda" for fs in ms.functions.values() for f in fs.facts))
        self.pinned_bits = project.module_bits(self._has_pinned)
        self.obs.cuda = self.cuda_bits != 0

    # ---------------------------------------------------------------- plumbing

    def run(self) -> list[Raw]:
        for gid, (ms, fs) in sorted(self.p.functions.items()):
            try:
                self._function(gid, ms, fs)
            except Exception as err:  # noqa: BLE001 - a bug must not take the other files down
                self._internal(ms.display, err)
        try:
            self._program_checks()
        except Exception as err:  # noqa: BLE001
            self._internal("program-wide checks", err)
        return self.raw

    def _internal(self, where: str, err: Exception) -> None:
        if os.environ.get("GPUDOCTOR_DEBUG"):
            raise err
        self.internal_errors.append(
            f"{where}: internal error in gpudoctor check ({type(err).__name__}: {err}); please report it"
        )

    def loc(self, ms: ModuleSummary, fs: FuncSummary | None, site: Site) -> Location:
        fn = "" if fs is None or fs.fid == "<module>" else fs.fid
        return Location(file=ms.display, line=site.line, col=site.col, function=fn)

    def emit(
        self,
        code: str,
        severity: Severity,
        message: str,
        fix: Fix,
        ms: ModuleSummary,
        fs: FuncSummary | None,
        site: Site,
        evidence: Evidence | None = None,
    ) -> None:
        key = (code, ms.path, site.line, site.col)
        if key in self._seen:
            return
        self._seen.add(key)
        notes = tuple(dict.fromkeys((*(evidence.notes if evidence else ()), ASSUMPTION)))
        ev = Evidence(
            metrics=evidence.metrics if evidence else (),
            settings=evidence.settings if evidence else (),
            notes=notes,
        )
        self.raw.append(
            Raw(code, severity, message, fix, ms.path, self.loc(ms, fs, site), (site.line, site.end_line), ev)
        )

    def cuda(self, ms: ModuleSummary) -> bool:
        return self.p.world_has(ms.path, self.cuda_bits)

    def active(self, ms: ModuleSummary, ctx: Ctx) -> bool:
        return self.p.active(ctx, ms.path)[0]

    def resolve(self, ms: ModuleSummary, sym: Sym) -> Resolved:
        return self.p.resolve(sym, ms.path)

    def source(self, ms: ModuleSummary, site: Site, max_lines: int = 8) -> str:
        lines = [ms.lines.get(i, "") for i in range(site.line, min(site.end_line, site.line + max_lines - 1) + 1)]
        return _dedent("\n".join(lines))

    def loop_of(self, fs: FuncSummary, lid: int) -> Loop | None:
        for loop in fs.loops:
            if loop.id == lid:
                return loop
        return None

    def where_step(self, ms: ModuleSummary, fs: FuncSummary, gid: Gid, lid: int) -> str:
        if lid >= 0:
            loop = self.loop_of(fs, lid)
            if loop is not None:
                return f"the training loop at {ms.display}:{loop.site.line}"
        return f"`{fs.name}()`, which runs once per training step"

    # ---------------------------------------------------------------- loader settings

    def loader_value(self, ms: ModuleSummary, lf: LoaderFact, key: str) -> tuple[str, Resolved | None]:
        """("missing" | "set" | "unknown", resolved value) of a DataLoader argument."""
        if key in lf.kwargs:
            return "set", self.resolve(ms, lf.kwargs[key])
        for star in lf.stars:
            items, _origins = sym_dict_items(self.p.resolver, star, ms.path)
            if items is None:
                return "unknown", None
            if key in items:
                return "set", self.resolve(ms, items[key])
        return "missing", None

    def _has_pinned(self, ms: ModuleSummary) -> bool:
        for fs in ms.functions.values():
            for f in fs.facts:
                if f.kind == "pin_memory_call" and self.active(ms, f.ctx):
                    return True
            for lf in fs.loaders:
                if not self.active(ms, lf.ctx):
                    continue
                state, r = self.loader_value(ms, lf, "pin_memory")
                if state == "set" and r is not None and r.truth() is not False:
                    return True
        return False

    # ---------------------------------------------------------------- per function

    def _function(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary) -> None:
        for lf in fs.loaders:
            if self.active(ms, lf.ctx):
                self._loader(gid, ms, fs, lf)
        for sync in fs.syncs:
            lid = self.p.step_context(gid, sync.ctx)
            if lid is None or not self.cuda(ms) or not self.active(ms, sync.ctx):
                continue
            self._sync(gid, ms, fs, sync, lid)
        for tr in fs.transfers:
            lid = self.p.step_context(gid, tr.ctx)
            if lid is None or not self.active(ms, tr.ctx):
                continue
            self.obs.transfers += 1
            nb = self.resolve(ms, tr.non_blocking) if tr.non_blocking is not None else None
            if nb is not None and nb.truth() is not False:
                self.obs.transfers_non_blocking += 1
                continue
            if self.cuda(ms) and self.p.world_has(ms.path, self.pinned_bits) and self._from_pinned(ms, fs, lid):
                self._blocking_copy(gid, ms, fs, tr, lid, nb)
        for opt in fs.optimizers:
            if self.active(ms, opt.ctx):
                self._optimizer(ms, fs, opt)
        for f in fs.facts:
            if f.kind == "empty_cache" and self.active(ms, f.ctx):
                self._empty_cache(gid, ms, fs, f)
            elif f.kind == "data_parallel" and self.active(ms, f.ctx):
                self._data_parallel(ms, fs, f)
            elif f.kind in ("autocast_deprecated", "scaler_deprecated"):
                self._deprecated_amp(ms, fs, f)
        for lid in sorted(self.p.step_loops.get(gid, ())):
            loop = self.loop_of(fs, lid)
            if loop is not None and self.active(ms, loop.ctx):
                self.obs.step_loops.append(self.loc(ms, fs, loop.site))
        self._eval_loops(gid, ms, fs)

    # GD201 / GD301 / GD202 -------------------------------------------------------

    def _loader(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary, lf: LoaderFact) -> None:
        loc = self.loc(ms, fs, lf.site)
        before = self.source(ms, lf.site)
        settings: dict[str, str] = {}
        nw_state, nw = self.loader_value(ms, lf, "num_workers")
        pin_state, pin = self.loader_value(ms, lf, "pin_memory")
        pw_state, pw = self.loader_value(ms, lf, "persistent_workers")
        pf_state, pf = self.loader_value(ms, lf, "prefetch_factor")
        bs_state, bs = self.loader_value(ms, lf, "batch_size")
        settings["num_workers"] = _shown(nw_state, nw, "0")
        settings["pin_memory"] = _shown(pin_state, pin, "False")
        settings["persistent_workers"] = _shown(pw_state, pw, "False")
        settings["prefetch_factor"] = _shown(pf_state, pf, "2")
        self.obs.loaders.append((loc, settings))
        if bs_state == "set" and bs is not None and bs.known:
            self.obs.batch_sizes.append(f"batch_size={bs.value!r} at {_s(loc)}")
        elif bs_state == "missing":
            self.obs.batch_sizes.append(f"batch_size=1 (default) at {_s(loc)}")
        if pin_state == "set" and pin is not None and pin.truth():
            self.obs.pinned.append(loc)

        # GD201: no worker processes
        zero_workers = nw_state == "missing" or (
            nw_state == "set" and nw is not None and nw.known and nw.value == 0 and nw.value is not False
        )
        if zero_workers and not lf.in_memory:
            how = _how("num_workers", nw_state, nw, "0")
            ev = Evidence(
                settings=(SettingRef("DataLoader.num_workers", nw.value if nw is not None else 0, loc),),
                notes=tuple(filter(None, [_origin_note("num_workers", nw)])),
            )
            arg_fix = self._arg_fix(nw, "4")
            instruction = (
                f"Load batches in worker processes: set num_workers to about the CPU cores you can spare "
                f"(e.g. 4) on the DataLoader at {_s(loc)}, with persistent_workers=True"
                + (f"; or change the default of {arg_fix[0]}" if arg_fix else "")
            )
            self.emit(
                "GD201",
                Severity.WARNING,
                f"DataLoader at {_s(loc)} loads every batch in the training process ({how}): "
                "the step waits while the main process reads and collates each batch",
                Fix(instruction, before, _with_kwargs(before, {"num_workers": "4", "persistent_workers": "True"})),
                ms,
                fs,
                lf.site,
                ev,
            )

        # GD301: pageable batches copied to the GPU
        if self.cuda(ms) and self._batches_to_gpu(ms) and (
            pin_state == "missing" or (pin_state == "set" and pin is not None and pin.truth() is False)
        ):
            how = _how("pin_memory", pin_state, pin, "False")
            copy = self._first_transfer(ms)
            ev = Evidence(
                settings=(SettingRef("DataLoader.pin_memory", pin.value if pin is not None else False, loc),),
                notes=tuple(filter(None, [_origin_note("pin_memory", pin), f"batches are copied to the GPU at {copy}" if copy else ""])),
            )
            self.emit(
                "GD301",
                Severity.WARNING,
                f"DataLoader at {_s(loc)} returns pageable batches ({how}) that are copied to the GPU"
                + (f" at {copy}" if copy else "")
                + ": each copy is staged through a pinned buffer and cannot overlap compute",
                Fix(
                    f"Set pin_memory=True on the DataLoader at {_s(loc)} and copy with .to(device, non_blocking=True)",
                    before,
                    _with_kwargs(before, {"pin_memory": "True"}),
                ),
                ms,
                fs,
                lf.site,
                ev,
            )

        # GD202: workers started again every epoch
        positive = nw_state == "set" and nw is not None and (
            nw.value is POSITIVE_VALUE or (nw.known and isinstance(nw.value, int) and not isinstance(nw.value, bool) and nw.value > 0)
        )
        if positive:
            self._worker_threads(ms, fs, lf, str(nw.value) if nw is not None and nw.known else "its")
        not_persistent = pw_state == "missing" or (pw_state == "set" and pw is not None and pw.truth() is False)
        if positive and not_persistent and not lf.ctx.loops:
            epoch = self._epoch_loop_using(ms, self._bindings(gid, lf))
            if epoch is not None:
                workers = nw.value if nw is not None and nw.known else "its"
                how = _how("persistent_workers", pw_state, pw, "False")
                self.emit(
                    "GD202",
                    Severity.INFO,
                    f"DataLoader at {_s(loc)} starts {workers} worker processes again at every epoch of the loop at "
                    f"{epoch} ({how}): each epoch begins with a stall while they start",
                    Fix(
                        f"Keep the workers alive across epochs: persistent_workers=True on the DataLoader at {_s(loc)}",
                        before,
                        _with_kwargs(before, {"persistent_workers": "True"}),
                    ),
                    ms,
                    fs,
                    lf.site,
                    Evidence(settings=(SettingRef("DataLoader.persistent_workers", pw.value if pw is not None else False, loc),)),
                )

    def _from_pinned(self, ms: ModuleSummary, fs: FuncSummary, lid: int) -> bool:
        """False when the step loop visibly iterates DataLoaders that do not pin memory."""
        loop = self.loop_of(fs, lid) if lid >= 0 else None
        if loop is None or not loop.iter_names:
            return True
        fed: list[bool] = []
        for other in self.p.world_modules(ms.path):
            for fid, ofs in other.functions.items():
                for lf in ofs.loaders:
                    if not self.active(other, lf.ctx):
                        continue
                    if self._bindings(f"{other.path}::{fid}", lf) & loop.iter_names:
                        state, r = self.loader_value(other, lf, "pin_memory")
                        fed.append(state == "set" and r is not None and r.truth() is not False)
        return not fed or any(fed)

    def _worker_threads(self, ms: ModuleSummary, fs: FuncSummary, lf: LoaderFact, workers: str) -> None:
        """GD204: a worker_init_fn that gives every worker all the cores' worth of intra-op threads."""
        if lf.worker_init is None:
            return
        ref, bound_args, bound_kwargs = lf.worker_init
        gid = self.p.resolve_callee(ms, ref)
        if gid is None or gid not in self.p.functions:
            return
        init_ms, init_fs = self.p.functions[gid]
        kwargs = dict(bound_kwargs)
        for f in init_fs.facts:
            if f.kind != "set_num_threads" or f.value is None or not self.active(init_ms, f.ctx):
                continue
            sym, where = f.value, init_ms.path
            if sym[0] == "param" and sym[1] == gid:
                name, index, default = sym[2], sym[3], sym[4]
                if name in kwargs:
                    sym, where = kwargs[name], ms.path
                elif 0 <= index < len(bound_args):
                    sym, where = bound_args[index], ms.path
                elif default is not None:
                    sym = default
            r = self.p.resolve(sym, where)
            if r.value is not POSITIVE_VALUE:
                continue  # a fixed count may fit the machine; only "all the cores" per worker surely does not
            loc = self.loc(ms, fs, lf.site)
            line = init_ms.lines.get(f.site.line, "").strip()
            self.emit(
                "GD204",
                Severity.WARNING,
                f"DataLoader at {_s(loc)} starts {workers} workers whose worker_init_fn `{init_fs.name}` sets "
                f"torch.set_num_threads to the core count ({init_ms.display}:{f.site.line}): each worker runs as "
                "many intra-op threads as the machine has cores, next to the training process's own",
                Fix(
                    "Give each worker one intra-op thread (torch.set_num_threads(1) in worker_init_fn, PyTorch's "
                    "default for workers) and leave the cores to the training process",
                    line,
                    re.sub(r"set_num_threads\(.*\)", "set_num_threads(1)", line),
                ),
                ms,
                fs,
                lf.site,
                Evidence(notes=(f"worker_init_fn: {init_fs.name} at {init_ms.display}:{init_fs.line}",)),
            )
            return

    def _arg_fix(self, r: Resolved | None, value: str) -> tuple[str, str] | None:
        if r is None or not r.origins:
            return None
        flag = r.origins[0].split("`")[1] if "`" in r.origins[0] else ""
        return (f"`{flag}`", value) if flag else None

    def _first_transfer(self, ms: ModuleSummary) -> str:
        """``file:line`` of the first batch copy to the GPU in the program ("" when there is none)."""
        world = self.p.worlds[self.p.index[ms.path]]
        if world not in self._transfer_memo:
            found = ""
            for other in self.p.world_modules(ms.path):
                for fs in other.functions.values():
                    tr = next((t for t in fs.transfers if t.ctx.loops or fs.fid != "<module>"), None)
                    if tr is not None:
                        found = f"{other.display}:{tr.site.line}"
                        break
                if found:
                    break
            self._transfer_memo[world] = found
        return self._transfer_memo[world]

    def _batches_to_gpu(self, ms: ModuleSummary) -> bool:
        return bool(self._first_transfer(ms))

    def _bindings(self, gid: Gid, lf: LoaderFact) -> set[str]:
        names = set(lf.bindings)
        if lf.returned_index is not None:
            for _caller, call in self.p.callers.get(gid, ()):
                if not call.assigned:
                    continue
                if lf.returned_index == -1 and len(call.assigned) == 1:
                    names.add(call.assigned[0] or "")
                elif 0 <= lf.returned_index < len(call.assigned):
                    names.add(call.assigned[lf.returned_index] or "")
        names.discard("")
        return names

    def _epoch_loop_using(self, ms: ModuleSummary, names: set[str]) -> str | None:
        if not names:
            return None
        for other in self.p.world_modules(ms.path):
            for fid, fs in other.functions.items():
                gid = f"{other.path}::{fid}"
                for lid in sorted(self.p.epoch_loops.get(gid, ())):
                    loop = self.loop_of(fs, lid)
                    if loop is not None and loop.mentions & names:
                        return f"{other.display}:{loop.site.line}"
        return None

    # GD102 / GD303 ----------------------------------------------------------------

    def _sync(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary, sync, lid: int) -> None:
        where = self.where_step(ms, fs, gid, lid)
        line = ms.lines.get(sync.site.line, "").strip()
        if sync.code == "GD102":
            message = (
                f"`{sync.text}` at {ms.display}:{sync.site.line} reads a GPU value on the host in every step of "
                f"{where}: the CPU stops until the GPU has finished all queued work"
            )
            instruction = (
                "Keep the value on the device (accumulate with `total += loss.detach()`) and read it every N "
                "steps (`if step % log_every == 0:`) or once per epoch"
            )
        else:
            message = (
                f"`{sync.text}` at {ms.display}:{sync.site.line} copies device data to the host in every step of "
                f"{where}: the copy waits for the GPU and stalls the next launch"
            )
            instruction = (
                "Keep results on the device (collect with `torch.cat` / running sums) and copy them to the host "
                "every N steps or once per epoch"
            )
        self.emit(
            sync.code,
            Severity.WARNING,
            message,
            Fix(instruction, line, _sync_after(line, sync.pattern, sync.text)),
            ms,
            fs,
            sync.site,
            Evidence(notes=(f"pattern: {sync.pattern}",)),
        )

    # GD302 ------------------------------------------------------------------------

    def _blocking_copy(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary, tr, lid: int, nb: Resolved | None) -> None:
        where = self.where_step(ms, fs, gid, lid)
        how = "non_blocking not set" if nb is None else f"non_blocking={nb.value!r}" + (
            f" from {nb.origin_text()}" if nb.origins else ""
        )
        self.emit(
            "GD302",
            Severity.WARNING,
            f"`{tr.text}` at {ms.display}:{tr.site.line} copies a pinned batch synchronously ({how}) in every step "
            f"of {where}: the host waits for each copy instead of queueing the next work",
            Fix(
                "Pass non_blocking=True: with pinned memory the copy overlaps with the host's next work, and CUDA "
                "stream order keeps it correct",
                tr.statement,
                _non_blocking_after(tr.statement, tr.method),
            ),
            ms,
            fs,
            tr.site,
        )

    # GD404 ------------------------------------------------------------------------

    def _optimizer(self, ms: ModuleSummary, fs: FuncSummary, opt) -> None:
        loc = self.loc(ms, fs, opt.site)
        has_foreach, has_fused = K.optimizer_support(opt.cls, K.installed_torch_version())

        def flag(name: str) -> bool | None | str:
            if name not in opt.kwargs:
                return "missing"
            return self.resolve(ms, opt.kwargs[name]).truth()

        fused, foreach, diff = flag("fused"), flag("foreach"), flag("differentiable")
        shown = opt.cls + (" (fused=True)" if fused is True else " (foreach=True)" if foreach is True else "")
        self.obs.optimizers.append((loc, shown))
        if opt.star or diff is True or not self.cuda(ms) or not has_foreach:
            return
        if fused is True or foreach is True:
            return
        before = self.source(ms, opt.site)
        version = K.installed_torch_version() or "current torch"
        if fused is False or foreach is False:
            which = "fused=False" if fused is False else "foreach=False"
            self.emit(
                "GD404",
                Severity.WARNING,
                f"torch.optim.{opt.cls} at {_s(loc)} is forced onto its for-loop implementation ({which}): every step "
                "launches several kernels per parameter tensor",
                Fix(
                    "Remove the flag, or pass " + ("fused=True" if has_fused else "foreach=True"),
                    before,
                    _with_kwargs(before, {"fused" if has_fused else "foreach": "True", "foreach" if has_fused else "fused": None}),
                ),
                ms,
                fs,
                opt.site,
            )
            return
        if fused == "missing" and foreach == "missing" and has_fused:
            self.emit(
                "GD404",
                Severity.INFO,
                f"torch.optim.{opt.cls} at {_s(loc)} uses the default foreach implementation; its fused CUDA "
                f"implementation (fused=True, torch {version}) updates all parameters in a few kernels",
                Fix(
                    f"Pass fused=True to torch.optim.{opt.cls} (parameters must be floating-point CUDA tensors)",
                    before,
                    _with_kwargs(before, {"fused": "True"}),
                ),
                ms,
                fs,
                opt.site,
                Evidence(notes=(f"installed torch: {version} (read from package metadata, not imported)",)),
            )

    # GD502 / GD601 / GD401 (spelling) ------------------------------------------------

    def _empty_cache(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary, f) -> None:
        lid = self.p.step_context(gid, f.ctx)
        line = ms.lines.get(f.site.line, "").strip()
        fix = Fix(
            "Remove torch.cuda.empty_cache(): the caching allocator reuses freed blocks; for fragmentation set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            line,
            "# (removed) " + line,
        )
        if lid is not None:
            self.emit(
                "GD502",
                Severity.WARNING,
                f"torch.cuda.empty_cache() at {ms.display}:{f.site.line} runs in every step of "
                f"{self.where_step(ms, fs, gid, lid)}: it synchronizes and returns the cache to the driver, so "
                "the next step pays cudaMalloc again",
                fix,
                ms,
                fs,
                f.site,
            )
        elif f.ctx.loops or gid in self.p.called_in_loop:
            self.emit(
                "GD502",
                Severity.INFO,
                f"torch.cuda.empty_cache() at {ms.display}:{f.site.line} runs inside a loop: each call synchronizes "
                "and empties the allocator's cache, which the next iteration refills with cudaMalloc",
                fix,
                ms,
                fs,
                f.site,
            )

    def _data_parallel(self, ms: ModuleSummary, fs: FuncSummary, f) -> None:
        line = ms.lines.get(f.site.line, "").strip()
        after = _ddp_after(line)
        self.emit(
            "GD601",
            Severity.WARNING,
            f"nn.DataParallel at {ms.display}:{f.site.line}: one process drives every GPU, scattering each batch, "
            "replicating the model every step and gathering outputs on GPU 0, under one GIL",
            Fix(
                "Use DistributedDataParallel, one process per GPU, launched with torchrun "
                "(`torchrun --nproc-per-node=N train.py`), with a DistributedSampler",
                line,
                "# torch.distributed.init_process_group(\"nccl\"); local_rank = int(os.environ[\"LOCAL_RANK\"])\n"
                + after,
            ),
            ms,
            fs,
            f.site,
        )

    def _deprecated_amp(self, ms: ModuleSummary, fs: FuncSummary, f) -> None:
        old, new = f.extra.split("|", 1)
        line = ms.lines.get(f.site.line, "").strip()
        self.emit(
            "GD401",
            Severity.INFO,
            f"`{f.text}` at {ms.display}:{f.site.line} uses the deprecated `{old}` spelling; current PyTorch "
            f"spells it `{new}`",
            Fix(f"Use {new} from torch.amp", line, _amp_after(line, old, new)),
            ms,
            fs,
            f.site,
        )

    # GD701 ------------------------------------------------------------------------

    def _eval_loops(self, gid: Gid, ms: ModuleSummary, fs: FuncSummary) -> None:
        if not fs.loops or gid in self.p.per_step:
            return
        training = self.p.training_loops.get(gid, set())
        candidates: dict[int, Loop] = {}
        for loop in fs.loops:
            if loop.id in training or any(lid in training for lid in loop.ctx.loops):
                continue
            if not loop.model_calls or not loop.target_is_batch:
                continue
            evaluated = loop.model_calls & loop.eval_before
            if not evaluated and not K.EVAL_FUNCTION.search(fs.name):
                continue
            if not self.active(ms, loop.ctx):
                continue
            candidates[loop.id] = loop
        for _lid, loop in sorted(candidates.items()):
            if any(outer in candidates for outer in loop.ctx.loops):
                continue
            loc = self.loc(ms, fs, loop.site)
            self.obs.eval_loops.append(loc)
            guarded = loop.ctx.no_grad or fs.no_grad_decorated or self._callers_no_grad(gid)
            if guarded:
                self.obs.eval_loops_guarded += 1
                continue
            model = sorted(loop.model_calls & loop.eval_before or loop.model_calls)[0]
            why = f"`{model}.eval()` before it" if model in loop.eval_before else f"in `{fs.name}()`"
            before = self.source(ms, Site(loop.site.line, loop.site.col, loop.site.end_line + 2), max_lines=3)
            self.emit(
                "GD701",
                Severity.WARNING,
                f"Evaluation loop at {_s(loc)} ({why}, no backward) calls `{model}(...)` with autograd on: every "
                "forward pass records the graph and keeps its activations",
                Fix(
                    "Run evaluation under torch.inference_mode() (or torch.no_grad()), or decorate the function "
                    "with @torch.inference_mode()",
                    before,
                    "with torch.inference_mode():\n" + _indent(before),
                ),
                ms,
                fs,
                loop.site,
            )

    def _callers_no_grad(self, gid: Gid) -> bool:
        callers = self.p.callers.get(gid, [])
        if not callers:
            return False
        for caller, call in callers:
            _, cfs = self.p.functions[caller]
            if not (call.ctx.no_grad or cfs.no_grad_decorated):
                return False
        return True

    # ---------------------------------------------------------------- program-wide (GD401, GD403)

    def _program_checks(self) -> None:
        facts: dict[str, list[tuple[ModuleSummary, FuncSummary, object]]] = {}
        for path in self.p.paths:
            ms = self.p.modules[path]
            for fs in ms.functions.values():
                for f in fs.facts:
                    facts.setdefault(f.kind, []).append((ms, fs, f))
        autocast_on: list[tuple[ModuleSummary, object]] = []
        autocast_off: list[tuple[ModuleSummary, object, str]] = []
        for ms, fs, f in facts.get("autocast", []) + facts.get("low_precision", []):
            ok, origins = self.p.active(f.ctx, ms.path)
            enabled = self.resolve(ms, f.value).truth() if f.value is not None else True
            loc = self.loc(ms, fs, f.site)
            if ok and enabled is not False and f.extra != "cpu":
                autocast_on.append((ms, f))
                self.obs.autocast.append(loc)
            else:
                r = self.resolve(ms, f.value) if f.value is not None else None
                why = ", ".join(origins or (r.origins if r else []))
                autocast_off.append(
                    (ms, f, f"autocast at {_s(loc)} is off unless {why} is changed" if why else f"autocast at {_s(loc)} is disabled")
                )
        on_bits = self._bits(autocast_on)
        for kind, target in (("compile", self.obs.compile), ("jit", self.obs.jit), ("ddp", self.obs.ddp)):
            for ms, fs, f in facts.get(kind, []):
                if self.active(ms, f.ctx):
                    target.append(self.loc(ms, fs, f.site))
        for ms, fs, f in facts.get("tf32", []):
            if self.active(ms, f.ctx) and self.resolve(ms, f.value).truth() is not False:
                value = self.resolve(ms, f.value).value
                if f.extra == K.MATMUL_PRECISION and value == "highest":
                    continue
                self.obs.tf32.append(self.loc(ms, fs, f.site))

        # GD401: a CUDA training loop without autocast
        reported_worlds: set[int] = set()
        for gid in sorted(self.p.step_loops):
            ms, fs = self.p.functions[gid]
            if not self.cuda(ms) or self.p.world_has(ms.path, on_bits):
                continue
            world = self.p.worlds[self.p.index[ms.path]]
            if world in reported_worlds:
                continue
            for lid in sorted(self.p.step_loops[gid]):
                loop = self.loop_of(fs, lid)
                if loop is None or not self.active(ms, loop.ctx):
                    continue
                reported_worlds.add(world)
                off = [text for m2, _f, text in autocast_off if self.p.world_has(ms.path, 1 << self.p.index[m2.path])]
                detail = off[0] if off else "no torch.autocast in the program"
                header = self.source(ms, loop.site, max_lines=1)
                step = next((m for m in fs.markers if lid in m.ctx.loops and m.kind == "backward"), None)
                step_line = ms.lines.get(step.site.line, "").strip() if step is not None else ""
                if step_line:
                    before = f"{header}\n    ...  # forward pass and loss\n    {step_line}"
                    after = (
                        f'{header}\n    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
                        f"        ...  # forward pass and loss\n    {step_line}"
                    )
                else:
                    before = f"{header}\n    loss = criterion(model(inputs), targets)"
                    after = (
                        f'{header}\n    with torch.autocast("cuda", dtype=torch.bfloat16):\n'
                        "        loss = criterion(model(inputs), targets)"
                    )
                self.emit(
                    "GD401",
                    Severity.INFO,
                    f"The training loop at {ms.display}:{loop.site.line} runs in FP32 on CUDA ({detail}): "
                    "on Tensor Core GPUs mixed precision runs matmuls and convolutions several times faster",
                    Fix(
                        'Run forward and loss under torch.autocast("cuda", dtype=torch.bfloat16) (Ampere and '
                        "later); with float16 (Volta, Turing) also scale the loss with torch.amp.GradScaler(\"cuda\")",
                        before,
                        after,
                    ),
                    ms,
                    fs,
                    loop.site,
                )
                break

        # GD403: convolutions, cudnn.benchmark never set
        bench_on: list[tuple[ModuleSummary, object]] = []
        bench_off: list[tuple[ModuleSummary, FuncSummary, object]] = []
        for ms, fs, f in facts.get("cudnn_benchmark", []):
            if not self.active(ms, f.ctx):
                continue
            if self.resolve(ms, f.value).truth() is False:
                bench_off.append((ms, fs, f))
            else:
                bench_on.append((ms, f))
                self.obs.benchmark_on.append(self.loc(ms, fs, f.site))
        determ: list[tuple[ModuleSummary, object]] = []
        for kind in ("cudnn_deterministic", "deterministic_algorithms"):
            for ms, fs, f in facts.get(kind, []):
                if self.active(ms, f.ctx) and self.resolve(ms, f.value).truth() is not False:
                    determ.append((ms, f))
                    self.obs.deterministic.append(self.loc(ms, fs, f.site))
        bench_bits, determ_bits = self._bits(bench_on), self._bits(determ)
        convs = [(ms, fs, f) for ms, fs, f in facts.get("conv", []) if self.active(ms, f.ctx)]
        for ms, fs, f in convs:
            self.obs.conv.append(self.loc(ms, fs, f.site))
        reported_worlds = set()
        for ms, fs, f in convs:
            if not self.cuda(ms) or self.p.world_has(ms.path, bench_bits) or self.p.world_has(ms.path, determ_bits):
                continue
            if not self._world_trains(ms):
                continue
            world = self.p.worlds[self.p.index[ms.path]]
            if world in reported_worlds:
                continue
            reported_worlds.add(world)
            off = [(m2, f2, x) for m2, f2, x in bench_off if self.p.world_has(ms.path, 1 << self.p.index[m2.path])]
            if off:
                m2, f2, x = off[0]
                site, where_ms, where_fs = x.site, m2, f2
                detail = f"cudnn.benchmark is set to False at {m2.display}:{x.site.line}"
                before = m2.lines.get(x.site.line, "").strip()
                after = re.sub(r"=\s*.+$", "= True", before)
            else:
                site, where_ms, where_fs = f.site, ms, fs
                detail = "cudnn.benchmark is never set"
                before = "# torch.backends.cudnn.benchmark is not set (default False)"
                after = "torch.backends.cudnn.benchmark = True  # once, at start-up: input shapes are fixed"
            self.emit(
                "GD403",
                Severity.INFO,
                f"Convolutions ({f.extra.rsplit('.', 1)[-1]} at {ms.display}:{f.site.line}) run with cuDNN's "
                f"heuristic algorithm choice ({detail}): with fixed input shapes, autotuning picks faster kernels",
                Fix(
                    "Set torch.backends.cudnn.benchmark = True once at start-up when input shapes do not change "
                    "from step to step (not when determinism is required)",
                    before,
                    after,
                ),
                where_ms,
                where_fs,
                site,
            )

    def _bits(self, items) -> int:
        bits = 0
        for ms, *_rest in items:
            bits |= 1 << self.p.index[ms.path]
        return bits

    def _world_trains(self, ms: ModuleSummary) -> bool:
        for other in self.p.world_modules(ms.path):
            for fid in other.functions:
                if f"{other.path}::{fid}" in self.p.step_loops:
                    return True
        return False


# --------------------------------------------------------------------------- text helpers


def _s(loc: Location) -> str:
    """``file:line`` for messages (the finding's location carries the column)."""
    return f"{loc.file}:{loc.line}"


def _shown(state: str, r: Resolved | None, default: str) -> str:
    if state == "missing":
        return f"{default} (default)"
    if state == "unknown" or r is None:
        return "set through **kwargs"
    if not r.known:
        return "decided at run time"
    text = repr(r.value)
    return f"{text} (from {r.origin_text()})" if r.origins else text


def _how(name: str, state: str, r: Resolved | None, default: str) -> str:
    if state == "missing":
        return f"{name} not set: default {default}"
    if r is not None and r.origins:
        return f"{name} comes from {r.origin_text()}"
    value = r.value if r is not None else default
    return f"{name}={value!r}"


def _origin_note(name: str, r: Resolved | None) -> str:
    if r is None or not r.origins:
        return ""
    return f"{name} comes from {r.origin_text()}"


def _dedent(text: str) -> str:
    lines = text.split("\n")
    indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
    cut = min(indents[1:], default=0) if len(lines) > 1 else 0
    first = lines[0].lstrip()
    rest = [x[min(cut, len(x) - len(x.lstrip())):] if x.strip() else x for x in lines[1:]]
    if rest:
        base = min((len(x) - len(x.lstrip()) for x in rest if x.strip()), default=0)
        rest = ["    " + x[base:] if x.strip() else x for x in rest]
        if rest and rest[-1].strip().startswith(")"):
            rest[-1] = rest[-1].strip()
    return "\n".join([first, *rest])


def _indent(text: str) -> str:
    return "\n".join("    " + x if x.strip() else x for x in text.split("\n"))


def _with_kwargs(source: str, changes: dict[str, str | None]) -> str:
    """The call in ``source`` with keyword arguments set (value) or removed (None)."""
    out = source
    for name, value in changes.items():
        pattern = re.compile(rf"(\b{name}\s*=\s*)([^,)\n]+)")
        if pattern.search(out):
            if value is None:
                out = re.sub(rf",?\s*\b{name}\s*=\s*[^,)\n]+", "", out, count=1)
            else:
                out = pattern.sub(lambda m, v=value: m.group(1) + v, out, count=1)
        elif value is not None:
            idx = _call_closing_paren(out)
            if idx is None:
                continue
            head = out[:idx].rstrip()
            sep = "" if head.endswith("(") else (" " if head.endswith(",") else ", ")
            out = head + sep + f"{name}={value}" + out[idx:]
    return out


def _call_closing_paren(source: str) -> int | None:
    """Index of the parenthesis that closes the DataLoader call in ``source`` (a line or a few of
    the user's code), else its first call; parsed, so that ``for (x, y) in DataLoader(ds):`` gets
    the call, not the tuple. Source that does not parse falls back to the first bracket."""
    text = textwrap.dedent(source)
    indent = next((len(ln) - len(ln.lstrip()) for ln in source.splitlines() if ln.strip()), 0)
    tree = None
    for attempt in (text, text + "\n    pass"):  # a for/with/if header without its body
        try:
            tree = ast.parse(attempt)
            break
        except SyntaxError:
            continue
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)] if tree is not None else []
    if not calls:
        return _closing_paren(source)

    def name(call: ast.Call) -> str:
        f = call.func
        return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""

    loaders = [c for c in calls if "DataLoader" in name(c)]
    call = min(loaders or calls, key=lambda c: (c.lineno, c.col_offset))
    lines = source.splitlines(keepends=True)
    if call.end_lineno is None or call.end_col_offset is None or call.end_lineno > len(lines):
        return _closing_paren(source)
    line = lines[call.end_lineno - 1]
    shift = indent if line.strip() else 0
    idx = sum(len(ln) for ln in lines[: call.end_lineno - 1]) + shift + call.end_col_offset - 1
    return idx if 0 <= idx < len(source) and source[idx] == ")" else _closing_paren(source)


def _closing_paren(source: str) -> int | None:
    """Index of the parenthesis that closes the first call in ``source``."""
    depth = 0
    started = False
    quote = ""
    i = 0
    while i < len(source):
        ch = source[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            nl = source.find("\n", i)
            if nl < 0:
                break
            i = nl
            continue
        elif ch in "([{":
            depth += 1
            started = True
        elif ch in ")]}":
            depth -= 1
            if started and depth == 0:
                return i
        i += 1
    return None


def _non_blocking_after(statement: str, method: str) -> str:
    if not statement:
        return ""
    if "non_blocking" in statement:
        return re.sub(r"non_blocking\s*=\s*[^,)]+", "non_blocking=True", statement)
    call = ".to(" if method == ".to" else ".cuda("
    out: list[str] = []
    rest = statement
    while call in rest:
        head, _, tail = rest.partition(call)
        close = _closing_paren("(" + tail)
        if close is None:
            out.append(head + call)
            rest = tail
            continue
        inner = tail[: close - 1]
        args = inner.strip()
        new_inner = (args + ", " if args else "") + "non_blocking=True"
        out.append(head + call + new_inner + ")")
        rest = tail[close:]
    return "".join(out) + rest


def _sync_after(line: str, pattern: str, text: str) -> str:
    if not line:
        return ""
    if pattern == ".item()" and "+=" in line and text.endswith(".item()"):
        receiver = text[: -len(".item()")]
        return line.replace(text, f"{receiver}.detach()") + "  # .item() once per epoch / every N steps"
    if pattern.startswith("float(") or pattern.startswith("int("):
        return "if step % log_every == 0:\n    " + line
    return "if step % log_every == 0:  # not every step\n    " + line


def _ddp_after(line: str) -> str:
    m = re.search(r"(?:\w+\.)*(?:DataParallel|data_parallel)\(", line)
    if m is None:
        return line
    rest = line[m.end() - 1 :]
    close = _closing_paren(rest)
    if close is None:
        return line[: m.start()] + "DistributedDataParallel(" + line[m.end() :]
    inner = rest[1:close].strip()
    inner = re.sub(r",?\s*(device_ids|output_device)\s*=\s*(\[[^\]]*\]|[^,)]+)", "", inner).strip()
    args = (inner + ", " if inner else "") + "device_ids=[local_rank]"
    return line[: m.start()] + "DistributedDataParallel(" + args + ")" + rest[close + 1 :]


def _amp_after(line: str, old: str, new: str) -> str:
    device = '"cuda"' if ".cuda." in old else '"cpu"'
    short = old.rsplit(".", 1)[-1]
    if "autocast" in short:
        out = re.sub(r"torch\.(cuda|cpu)\.amp\.autocast\(\s*\)", f"torch.autocast({device})", line)
        out = re.sub(r"torch\.(cuda|cpu)\.amp\.autocast\(", f"torch.autocast({device}, ", out)
        if out == line:
            out = re.sub(r"\bautocast\(\s*\)", f"autocast({device})", line)
            out = re.sub(r"\bautocast\((?!\"|')", f"autocast({device}, ", out)
            out = re.sub(r"from torch\.(cuda|cpu)\.amp import", "from torch.amp import", out)
        return out
    out = re.sub(r"torch\.cuda\.amp\.GradScaler\(\s*\)", 'torch.amp.GradScaler("cuda")', line)
    out = re.sub(r"torch\.cuda\.amp\.GradScaler\(", 'torch.amp.GradScaler("cuda", ', out)
    if out == line:
        out = re.sub(r"\bGradScaler\(\s*\)", 'GradScaler("cuda")', line)
    return out

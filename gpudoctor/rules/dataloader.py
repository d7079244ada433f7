"""The DataLoader in a finding: its settings as evidence, its call with changed arguments, the fix at
its call site (as the script allows), `--verify`'s injections, and whether a loop changes its dataset in
place."""

from __future__ import annotations

from gpudoctor.model.findings import Finding, Fix, SettingRef
from gpudoctor.model.run import DataLoaderSetting, Injection
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.edits import dataloader_args, edit_fix, left_to_author, manual_note
from gpudoctor.rules.formatting import location_of


def dataloader_settings(dl: DataLoaderSetting) -> tuple[SettingRef, ...]:
    """The DataLoader's settings as evidence, each with the DataLoader's call site."""
    loc = location_of(dl.call_site)
    return (
        SettingRef("DataLoader.batch_size", dl.batch_size, loc),
        SettingRef("DataLoader.num_workers", dl.num_workers, loc),
        SettingRef("DataLoader.prefetch_factor", dl.prefetch_factor, loc),
        SettingRef("DataLoader.persistent_workers", dl.persistent_workers, loc),
        SettingRef("DataLoader.pin_memory", dl.pin_memory, loc),
    )


def dataloader_call(dl: DataLoaderSetting | None, **changes: object) -> str:
    """A ``DataLoader(...)`` call with the run's settings, and ``changes`` applied."""
    if dl is None:
        args: dict[str, object] = {"batch_size": 64}
    else:
        args = {"batch_size": dl.batch_size if dl.batch_size is not None else 64}
        if dl.num_workers:
            args["num_workers"] = dl.num_workers
            if dl.prefetch_factor not in (None, 2):
                args["prefetch_factor"] = dl.prefetch_factor
            if dl.persistent_workers:
                args["persistent_workers"] = True
        if dl.pin_memory:
            args["pin_memory"] = True
        if dl.drop_last:
            args["drop_last"] = True
    for k, v in changes.items():
        if v is None:
            args.pop(k, None)
        else:
            args[k] = v
    dataset = "dataset"
    inner = ", ".join([dataset, *(f"{k}={v!r}" for k, v in args.items())])
    return f"loader = DataLoader({inner})"


def dataloader_fix(instruction: str, dl: DataLoaderSetting | None, changes: dict[str, object], before: str = "",
                   after: str = "") -> Fix:
    """A DataLoader fix: the arguments ``changes`` set at the DataLoader's call site (an edit the report
    makes from the script's own line where the source is at hand), with an illustration until then."""
    before = before or dataloader_call(dl)
    after = after or dataloader_call(dl, **changes)
    if dl is None or dl.call_site is None:
        why = "no DataLoader was recorded" if dl is None else "the DataLoader's call site was not recorded"
        return Fix(instruction, before, after, illustration=why)
    edit = dataloader_args(dl.call_site.file, dl.call_site.line, changes)
    return edit_fix(instruction, before, after, edit, illustration="the script's source is not at hand")


def dataloader_of(ctx: RuleContext, finding: Finding) -> DataLoaderSetting | None:
    """The DataLoader a finding names (its location is the DataLoader's call site), else the main one."""
    s = ctx.settings
    if s is None or not s.dataloaders:
        return None
    loc = finding.location
    if loc is not None:
        for d in s.dataloaders:
            if d.call_site is not None and d.call_site.file == loc.file and d.call_site.line == loc.line:
                return d
    return ctx.main_dataloader()


def dataloader_injections(dl: DataLoaderSetting, changes: dict[str, object]) -> tuple[Injection, ...]:
    """--verify: DataLoader arguments set at the DataLoader's call site."""
    return tuple(
        Injection("dataloader", k, v, dl.call_site, text=f"DataLoader {k}={v!r} at {dl.call_site}")
        for k, v in changes.items()
    )


def no_dataloader_reason(ctx: RuleContext, dl: DataLoaderSetting | None) -> str | None:
    """Why DataLoader arguments cannot be injected, or None when they can."""
    if dl is None:
        if ctx.settings is None:
            return "the DataLoader's settings were not recorded (a bare trace): verify a run of `gpudoctor profile`"
        return "no DataLoader in this run"
    if dl.call_site is None:
        return "the DataLoader's call site is unknown: gpudoctor cannot tell which DataLoader to change"
    return None


def pinned_copy_injections(ctx: RuleContext, finding: Finding) -> tuple[Injection, ...] | str:
    """--verify for host→device copies: pin_memory=True at the DataLoader the finding names (when it
    does not pin yet) and non_blocking=True on the host→device copies of the batches it returns."""
    dl = dataloader_of(ctx, finding)
    if dl is None and ctx.settings is not None:
        return "no DataLoader: the copied tensors are made in the script; pinning them is a code change"
    why = no_dataloader_reason(ctx, dl)
    if why:
        return why
    out = [] if dl.pin_memory else list(dataloader_injections(dl, {"pin_memory": True}))
    out.append(Injection("non_blocking", "non_blocking", True, dl.call_site,
                         text=f"non_blocking=True on host→device copies of the batches of the DataLoader at {dl.call_site}"))
    return tuple(out)


def dataset_changed(src, fn, lf) -> tuple[str, bool] | None:  # noqa: ANN001 - StaticContext, Function, LoaderFact
    """Where a loop that iterates the DataLoader ``lf`` (of ``fn``) changes its dataset in place
    (``ds.epoch = epoch``, ``ds.set_epoch(epoch)``, ``loader.dataset.…``), and whether it does so at every
    step (in a step loop); None when no loop of its program does. Workers hold a copy of the dataset: one
    kept across epochs (``persistent_workers=True``) never sees a change made after it started, and no
    worker sees a change made while it runs (at every step)."""
    names = src.loader_names(fn, lf)
    if not names:
        return None
    receivers = {f"{n}.dataset" for n in names} | ({lf.dataset} if lf.dataset else set())
    # the loops of the program that change anything in place, by the first name of what they change (made
    # once per program: looking through every loop for every DataLoader was quadratic in a file's size)
    index = _change_index(src, fn)
    candidates = {pos: (other, loop) for r in receivers for pos, other, loop in index.get(r.split(".", 1)[0], ())}
    found: tuple[str, bool] | None = None
    for _pos, (other, loop) in sorted(candidates.items()):  # in the program's order
        if not loop.mentions & names:
            continue
        steps = set(src.step_loop_ids(other))
        hit = sorted(r for r in loop.changes if r in receivers or any(r.startswith(x + ".") for x in receivers))
        if not hit:
            continue
        per_step = loop.id in steps
        where = (f"`{hit[0]}` is changed in place in the {'step' if per_step else ''} loop at "
                 f"{other.file}:{loop.site.line}").replace("the  loop", "the loop")
        if per_step:
            return where, True
        found = found or (where, False)
    return found


def _change_index(src, fn) -> dict[str, list]:  # noqa: ANN001 - StaticContext, Function
    """``fn``'s program's loops that change something in place, by the first name of each thing changed
    (with each loop's place in the program's order), made once per program."""

    def make() -> dict[str, list]:
        index: dict[str, list] = {}
        pos = 0
        for other in src.program_functions(fn):
            for loop in other.loops:
                pos += 1
                for root in {c.split(".", 1)[0] for c in loop.changes}:
                    index.setdefault(root, []).append((pos, other, loop))
        return index

    return src.memo(f"dataset_changed.index.{src.program(fn)}", make)


def worker_changes(ctx: RuleContext, dl: DataLoaderSetting | None, n: int) -> dict[str, object]:
    """The DataLoader arguments the fix sets, for ``n`` suggested workers (``allowed_changes`` then takes out what
    the script does not allow)."""
    workers = dl.num_workers if dl is not None else None
    changes: dict[str, object] = {"num_workers": n, "persistent_workers": True}
    if workers and workers >= n:
        # already as many workers as the cores (or memory) allow: deepen the queue instead
        changes = {"prefetch_factor": (dl.prefetch_factor or 2) * 2, "persistent_workers": True}
    elif workers:
        changes["prefetch_factor"] = max(dl.prefetch_factor or 2, 2)
    if ctx.has_gpu() and dl is not None and not dl.pin_memory:
        changes["pin_memory"] = True
    return changes


def workers_fix(ctx: RuleContext, dl: DataLoaderSetting | None, instruction: str, changes: dict[str, object],
         notes: list[str]) -> Fix:
    """The fix of ``changes`` at the DataLoader, as the script allows (``RuleContext.workers_caveat``):
    without persistent_workers where they would be wrong (the evidence says why), and left to the author
    where workers themselves would not see a change the loop makes at every step."""
    caveat = ctx.workers_caveat(dl)
    if caveat is not None:
        notes.append(manual_note(caveat[0]) if caveat[1] else f"persistent_workers left out: {caveat[0]}")
    fix = dataloader_fix(instruction, dl, allowed_changes(ctx, dl, changes))
    return left_to_author(fix, caveat[0]) if caveat is not None and caveat[1] else fix


def allowed_changes(ctx: RuleContext, dl: DataLoaderSetting | None, changes: dict[str, object]) -> dict[str, object]:
    """``changes`` without persistent_workers where the script is against them (``RuleContext.workers_caveat``:
    its own choice, or a loop that changes the dataset in place): the fix's and ``--verify``'s."""
    if ctx.workers_caveat(dl) is None:
        return changes
    return {k: v for k, v in changes.items() if k != "persistent_workers"}

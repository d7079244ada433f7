"""The DataLoaders in a script's source, for `gpudoctor check`: GD201's static findings (a DataLoader, or a
Hugging Face Trainer through its ``TrainingArguments``, that loads every batch in the training process) and the
checklist's judges of workers and prefetching. ``static`` recognises the loaders (``StaticContext.loaders``)
and the Trainer's (the "hf_loader" facts: ``TrainingArguments(dataloader_num_workers=...)``); GD201's
``StaticCheck`` runs these (``rules/gd201_dataloader_stall.py``), as its runtime check reads the load's model
in ``rules/load_model.py``."""

from __future__ import annotations

from gpudoctor.model.findings import ChecklistStatus, Evidence, Fix, SettingRef, Severity
from gpudoctor.rules.dataloader import dataset_changed
from gpudoctor.rules.edits import dataloader_args, manual_note
from gpudoctor.rules.load_model import workers_here
from gpudoctor.rules.static_api import Fact, Function, LoaderFact, Resolved, StaticContext
from gpudoctor.rules.static_api.text import (
    NO_LOADER,
    arg_fix,
    at,
    first_of,
    how,
    origin_note,
    shown,
    with_kwargs,
)


def no_workers(src: StaticContext, fn: Function, lf: LoaderFact) -> None:
    """GD201: a DataLoader that loads in the training process (num_workers 0 or not set), unless it
    indexes a TensorDataset already in memory."""
    nw_state, nw = src.loader_value(fn, lf, "num_workers")
    zero_workers = nw_state == "missing" or (
        nw_state == "set" and nw is not None and nw.known and nw.value == 0 and nw.value is not False
    )
    if not zero_workers or lf.in_memory:
        return
    loc = src.location(fn, lf.site)
    before = src.source(fn, lf.site)
    ev = Evidence(
        settings=(SettingRef("DataLoader.num_workers", nw.value if nw is not None else 0, loc),),
        notes=tuple(filter(None, [origin_note("num_workers", nw)])),
    )
    n, sizing = workers_here()
    sized = src.sized("num_workers", fn, lf.site)  # `check --workers N`, or what --verify measured (`--from RUN`)
    if sized.value is not None:
        n, sizing = sized.value, f"How many: {sized.value}, {sized.why}."
    flag = arg_fix(nw, str(n))
    # what the automatic fix would break: the author's to change (the finding stays, its evidence says why)
    pw_state, _pw = src.loader_value(fn, lf, "persistent_workers")
    changed = dataset_changed(src, fn, lf)
    manual = ""
    if lf.unpicklable:
        manual = (f"{lf.unpicklable}: worker processes started by spawn or forkserver (macOS, Windows; Linux from "
                  "Python 3.14) receive it pickled and cannot unpickle it; define it at the module's top level")
    elif changed is not None and changed[1]:
        manual = f"{changed[0]}: a worker holds its own copy of the dataset and would not see the change"
    keep = pw_state == "missing" and changed is None  # persistent workers keep their first copy of the dataset
    changes: dict[str, object] = {"num_workers": n, **({"persistent_workers": True} if keep else {})}
    instruction = (
        f"Load batches in worker processes: set num_workers on the DataLoader at {at(loc)}"
        + (", with persistent_workers=True" if keep else "")
        + (f" (or change the default of {flag[0]})" if flag else "") + f". {sizing}"
    )
    src.report(
        "GD201",
        Severity.WARNING,
        f"DataLoader at {at(loc)} loads every batch in the training process "
        f"({how('num_workers', nw_state, nw, '0')}): the step waits while the main process reads and collates "
        "each batch",
        Fix(instruction, before, with_kwargs(before, {k: str(v) for k, v in changes.items()}),
            # a count from a command-line flag: its default is the script's to change (the instruction says so)
            () if flag or sized.refused or manual else
            (dataloader_args(fn.file, lf.site.line, changes, col=lf.site.col),)),
        fn,
        lf.site,
        Evidence(ev.metrics, ev.time_ranges, ev.settings,
                 (*ev.notes, *filter(None, [sized.refused, manual_note(manual) if manual else ""]))),
    )


def trainer_no_workers(src: StaticContext, fn: Function, f: Fact) -> None:
    """GD201: a Hugging Face Trainer whose ``TrainingArguments`` leave ``dataloader_num_workers`` at 0."""
    state, nw = trainer_workers(src, fn, f)
    if not (state == "missing" or (nw is not None and nw.known and nw.value == 0 and nw.value is not False)):
        return
    loc = src.location(fn, f.site)
    before = src.source(fn, f.site)
    n, sizing = workers_here()
    sized = src.sized("num_workers", fn, f.site)
    if sized.value is not None:
        n, sizing = sized.value, f"How many: {sized.value}, {sized.why}."
    src.report(
        "GD201",
        Severity.WARNING,
        f"`{f.text.split('(', 1)[0]}(...)` at {at(loc)}: the Trainer loads every batch in the training process "
        f"({how('dataloader_num_workers', state, nw, '0')}): the step waits while the main process reads and "
        "collates each batch",
        Fix(
            f"Let the Trainer load batches in worker processes: dataloader_num_workers on the TrainingArguments "
            f"at {at(loc)}, with dataloader_persistent_workers=True. {sizing}",
            before,
            with_kwargs(before, {"dataloader_num_workers": str(n), "dataloader_persistent_workers": "True"}),
        ),
        fn,
        f.site,
        Evidence(settings=(SettingRef("TrainingArguments.dataloader_num_workers", nw.value if nw else 0, loc),)),
    )


def trainer_workers(src: StaticContext, fn: Function, f: Fact) -> tuple[str, Resolved | None]:
    """The Trainer's num_workers as its ``TrainingArguments`` set it (a "hf_loader" fact of ``static``)."""
    return ("set", src.resolve(fn, f.value)) if f.value is not None else ("missing", None)


def loader_settings(src: StaticContext) -> list[tuple[str, str, str]]:
    """(file:line, num_workers, prefetch_factor) of every DataLoader, as the checklist shows them."""
    out = []
    for fn, lf in src.loaders():
        loc = src.location(fn, lf.site)
        out.append((
            first_of([loc]),
            shown(*src.loader_value(fn, lf, "num_workers"), "0"),
            shown(*src.loader_value(fn, lf, "prefetch_factor"), "2"),
        ))
    for fn, f in src.facts("hf_loader"):  # the Trainer's DataLoaders, from its TrainingArguments
        if src.active(fn, f.ctx):
            out.append((first_of([src.location(fn, f.site)]), shown(*trainer_workers(src, fn, f), "0"), "2 (default)"))
    return out


def judge_workers(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loaders = loader_settings(src)
    if not loaders:
        return ChecklistStatus.NOT_APPLICABLE, NO_LOADER
    text = "; ".join(f"num_workers={workers} at {where}" for where, workers, _pf in loaders[:3])
    values = [workers for _where, workers, _pf in loaders]
    if all(not v.startswith(("0", "set", "decided")) for v in values):
        return ChecklistStatus.APPLIED, text
    if any(v.startswith("0") for v in values):
        return ChecklistStatus.NOT_APPLICABLE, (
            text + ": the dataset is a TensorDataset in memory, or the loader is not used by default"
        )
    return ChecklistStatus.NOT_MEASURABLE, text + " (computed at run time)"


def judge_prefetch(src: StaticContext) -> tuple[ChecklistStatus, str]:
    loaders = loader_settings(src)
    if not loaders:
        return ChecklistStatus.NOT_APPLICABLE, NO_LOADER
    with_workers = [(where, pf) for where, workers, pf in loaders if not workers.startswith("0")]
    if not with_workers:
        return ChecklistStatus.NOT_APPLICABLE, "num_workers=0: prefetching starts with workers (see num_workers > 0 above)"
    where, pf = with_workers[0]
    return ChecklistStatus.APPLIED, f"prefetch_factor={pf} per worker at {where}; raise it if load times vary"

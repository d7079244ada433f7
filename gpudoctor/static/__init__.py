"""``gpudoctor check``: review training scripts for performance mistakes without running them.

``check_paths(paths, config) -> Report`` reads the source with Python's ``ast``:
nothing is imported and nothing of the user's code runs. Findings use the rule
codes of ``profile`` (GD201 …), with confidence *static*, a ``file:line:col``,
a fix with a before/after snippet and no gain in time (nothing was measured).

How scripts are judged
----------------------
- **As they run with their argparse defaults, on a machine with a CUDA GPU.**
  ``num_workers=args.workers`` with ``--workers`` defaulting to 0 is a
  DataLoader without workers ("num_workers comes from `--workers` (default
  0)"); code under ``if args.fixed:`` whose flag defaults to False does not run;
  ``torch.cuda.is_available()`` is taken as True. Checks about GPU costs (GD102,
  GD301, GD302, GD303, GD401, GD403, GD404) need CUDA to appear in the program
  (``.cuda()``, ``"cuda"``, ``"gpu"``, ``torch.cuda.*``, an Accelerate
  ``Accelerator``): a CPU-only script is not told about GPU costs. The device is
  read the same way for every script, from where the script chooses it: a device
  that comes from its argparse defaults (``--accel`` off: the CPU), never from a
  device copied from a tensor (``.to(src.device)`` follows ``src`` wherever it is).
- **Training loops**: a loop is a *step loop* when it calls ``.backward()`` or
  ``optimizer.step()`` (itself or through a function of the project) and no loop
  inside it does; a loop around step loops is an *epoch loop*. Functions called
  from a step loop run once per step, and so do the functions they call, across
  files. Calls and imports are followed inside the project folder (the folder
  given, or the one above the script's topmost package), never into installed
  packages.
- **Every-N-steps code is not per step**: statements under an ``if`` whose test
  uses ``%`` (``if step % 100 == 0:``) or compares a counter with a constant
  (``if step == 0:``) run only sometimes; they are not reported. Their ``else``
  branch is. Code after the step loop (per-epoch logging) is never reported.
- **GD102 or GD303**: reading a scalar (``.item()``, ``float(t)``, ``int(t)``,
  ``print(t)``, an f-string or logging call of a device tensor) is a host
  synchronization, GD102; copying tensor data to the host (``.cpu()``,
  ``.numpy()``, ``.tolist()``, ``.to("cpu")``) is a device-to-host copy every
  step, GD303. A value is a device tensor when it comes from a model or loss
  call, a ``.to(device)``/``.cuda()``, or is the receiver of ``.backward()``;
  batches straight from a DataLoader are host tensors.
- **Mixed precision** counts when ``torch.autocast`` (any spelling) is on by
  default, when the model is cast to half / bfloat16, or when Accelerate,
  Lightning or the Hugging Face ``TrainingArguments`` are asked for it.
- **GD204** is reported when a DataLoader's ``worker_init_fn`` (a project
  function, directly or through ``functools.partial``) sets
  ``torch.set_num_threads`` to the core count: every worker then runs as many
  threads as there are cores. A fixed count is not judged (it may fit the machine).
- **GD404** decides from the optimizer's class name and the installed torch's
  version (read from package metadata, torch is not imported): ``fused`` for
  Adam and AdamW (torch ≥ 2.0) and SGD (≥ 2.3); the other ``torch.optim``
  optimizers already run ``foreach`` by default on CUDA.

Each code's static check lives in its rule's module (``Rule.static``, written against
``gpudoctor.rules.static_api``); this package reads and links the source and runs
them. Severity policy: see ``gpudoctor.static.context`` (warning: a cost paid every
step; info: depends on hardware, data or model, or paid once per epoch).

Suppression: ``# gpudoctor: ignore[GD201]`` (several codes separated by commas)
or a bare ``# gpudoctor: ignore`` on any line of the flagged statement.
``select`` / ``ignore`` of ``[tool.gpudoctor]`` and the CLI apply as for ``profile``.

Robustness: a file that is missing, not UTF-8 (or its declared encoding), or
does not parse becomes one line in ``Report.errors``; the others are checked.
Many files are scanned in parallel processes.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from gpudoctor import __version__
from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model.findings import (
    REPORT_SCHEMA_VERSION,
    Confidence,
    Finding,
    Gain,
    Report,
    RuleInfo,
    SummaryStat,
)
from gpudoctor.rules.dataloader import dataset_changed
from gpudoctor.rules.registry import static_codes
from gpudoctor.rules.static_api.names import installed_torch_version
from gpudoctor.static.checklist import build_checklist, checklist_rows
from gpudoctor.static.context import ProjectContext, Raw, run_checks
from gpudoctor.static.link import Project
from gpudoctor.static.scan import reset_caches, scan_file
from gpudoctor.static.sizing import Sizing
from gpudoctor.static.snippets import with_source
from gpudoctor.static.sources import ImportResolver, Target, discover, read_source
from gpudoctor.static.summary import FileError, ModuleSummary

__all__ = ["STATIC_CODES", "check_paths", "checklist_rows", "loader_sources"]

#: Every code ``gpudoctor check`` can report: the rules with a static check.
STATIC_CODES = static_codes()

#: Below this many files, scanning in one process is faster than starting workers.
PARALLEL_MIN_FILES = 48
#: Project modules reached through imports are followed this far (files), at most.
MAX_FOLLOWED_MODULES = 5000

_GAIN_NOTE = "static check: not measured; `gpudoctor profile` measures the share of step time at stake"


def check_paths(paths: Sequence[Path], config: Config, *, sizing: Sizing | None = None,
                overlay: Mapping[str, str] | None = None) -> Report:
    """Review the given files and folders; see the module documentation for how.

    ``sizing``: what the fixes write where the rules do not size it themselves (``static.sizing``:
    ``--workers N``, what ``--verify`` measured);
    ``overlay``: texts that stand in for files (absolute path → text: ``--fix`` / ``--diff``
    between passes, before anything is written)."""
    overlay = dict(overlay or {})
    targets, modules, file_errors = _read_project(paths, overlay)
    project = Project(modules, [str(t.path) for t in targets])
    checks = run_checks(project, sizing)
    findings = _filter(checks.raw, modules, config, _texts(overlay))
    findings = tuple(sorted(findings, key=_order))
    enabled = [c for c in static_codes() if config.rule_enabled(c)]
    checklist = build_checklist(checks, findings, config.rule_enabled)
    return Report(
        schema_version=REPORT_SCHEMA_VERSION,
        gpudoctor_version=__version__,
        kind="check",
        source=" ".join(str(p) for p in paths),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        findings=findings,
        checklist=checklist,
        summary=_summary({str(t.path) for t in targets}, modules, checks, file_errors),
        environment={
            "python": platform.python_version(),
            "torch (installed)": installed_torch_version() or "not installed",
        },
        errors=tuple(e.message for e in sorted(file_errors, key=lambda e: e.path)) + tuple(checks.internal_errors),
        rules_run=tuple(enabled),
        rules=_rule_infos(enabled),
    )


def _read_project(paths: Sequence[Path], overlay: Mapping[str, str]
                  ) -> tuple[list[Target], dict[str, ModuleSummary], list[FileError]]:
    """The targets among ``paths``, every module read (the targets and the project modules they import), and
    the files that could not be; a UsageError when not one target could be read."""
    reset_caches()
    targets, errors, roots = discover(list(paths))
    if not targets:
        if errors:
            raise UsageError(errors[0].message if len(errors) == 1 else f"{errors[0].message} (and {len(errors) - 1} more)")
        raise UsageError(f"no Python files in {', '.join(str(p) for p in paths)}; pass a script or a folder of scripts")
    root_strs = [str(r) for r in roots]
    modules: dict[str, ModuleSummary] = {}
    file_errors: list[FileError] = list(errors)
    jobs = [(str(t.path), t.display) for t in targets]
    _scan_all(jobs, root_strs, modules, file_errors, overlay)
    if not any(path in modules for path, _display in jobs):  # not one file could be read
        msgs = [e.message for e in file_errors]
        raise UsageError(msgs[0] if len(msgs) == 1 else f"{msgs[0]} (and {len(msgs) - 1} more files that could not be checked)")
    _follow_imports(modules, root_strs, file_errors, overlay)
    return targets, modules, file_errors


def loader_sources(file: Path, texts: Mapping[str, str], names: Mapping[str, str] | None = None
                   ) -> dict[int, tuple[str, bool]]:
    """For a run's analysis (``engine.loader_source_of``): the DataLoaders built in ``file`` whose loops change
    their dataset in place, by each line of the DataLoader's call: (where, at every step), as
    ``rules.dataloader.dataset_changed`` says for ``check``. ``texts``: the sources the run ran, by absolute
    path: ``file``'s and the script's (whose loop may iterate a DataLoader ``file`` builds), read together
    with the project modules they import; ``names``: how the run names them (absolute path -> name, e.g.
    relative to its working directory). Persistent workers keep
    their first copy of the dataset, and no worker sees a change made at every step."""
    path = os.path.abspath(file)
    targets, modules, _errors = _read_project([Path(p) for p in dict.fromkeys([path, *texts])], texts)
    ctx = ProjectContext(Project(modules, [str(t.path) for t in targets]), None)
    out: dict[int, tuple[str, bool]] = {}
    for fn, lf in ctx.loaders():
        if fn.path != path:
            continue
        changed = dataset_changed(ctx, fn, lf)
        if changed is not None:
            where = changed[0]
            for abs_path, name in (names or {}).items():
                if abs_path in modules:
                    where = where.replace(f"{modules[abs_path].display}:", f"{name}:")
            changed = (where, changed[1])
            for line in range(lf.site.line, max(lf.site.line, lf.site.end_line) + 1):
                out.setdefault(line, changed)
    return out


def project_files(paths: Sequence[Path]) -> list[str]:
    """The files a check of ``paths`` reads: those given or found in the folders given, and the project
    modules they import, transitively (what ``-o`` may never replace)."""
    reset_caches()
    targets, errors, roots = discover(list(paths))
    root_strs = [str(r) for r in roots]
    modules: dict[str, ModuleSummary] = {}
    file_errors: list[FileError] = list(errors)
    _scan_all([(str(t.path), t.display) for t in targets], root_strs, modules, file_errors)
    _follow_imports(modules, root_strs, file_errors)
    return sorted({*modules, *(str(t.path) for t in targets)})


# --------------------------------------------------------------------------- scanning


def _scan_one(job: tuple[str, str], roots: list[str],
              overlay: Mapping[str, str] | None = None) -> tuple[ModuleSummary | None, FileError | None]:
    path, display = job
    try:
        return scan_file(path, display, roots, text=overlay.get(path) if overlay else None)
    except Exception as err:  # noqa: BLE001 - one bad file must not stop the others
        if os.environ.get("GPUDOCTOR_DEBUG"):
            raise
        return None, FileError(
            display,
            f"{display}: internal error in gpudoctor check ({type(err).__name__}: {err}); please report it",
            internal=True,
        )


def _scan_chunk(jobs: list[tuple[str, str]], roots: list[str],
                overlay: Mapping[str, str] | None = None) -> list[tuple[ModuleSummary | None, FileError | None]]:
    return [_scan_one(job, roots, overlay) for job in jobs]


def _workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


def _scan_all(
    jobs: list[tuple[str, str]], roots: list[str], modules: dict[str, ModuleSummary], errors: list[FileError],
    overlay: Mapping[str, str] | None = None,
) -> None:
    results: list[tuple[ModuleSummary | None, FileError | None]] = []
    workers = _workers()
    if len(jobs) >= PARALLEL_MIN_FILES and workers > 1:
        chunks = [jobs[i::workers * 4] for i in range(workers * 4)]
        try:
            import multiprocessing

            method = "fork" if sys.platform.startswith("linux") else "spawn"
            with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method)) as pool:
                for part in pool.map(_scan_chunk, chunks, [roots] * len(chunks), [overlay] * len(chunks)):
                    results.extend(part)
        except (OSError, RuntimeError, ImportError):
            results = [_scan_one(job, roots, overlay) for job in jobs]  # no process pool here: one process
    else:
        results = [_scan_one(job, roots, overlay) for job in jobs]
    for summary, err in results:
        if err is not None:
            errors.append(err)
        if summary is not None:
            modules[summary.path] = summary


def _follow_imports(modules: dict[str, ModuleSummary], roots: list[str], errors: list[FileError],
                    overlay: Mapping[str, str] | None = None) -> None:
    """Scan project modules that the checked files import but were not given."""
    from gpudoctor.static.sources import display_path

    resolver = ImportResolver([Path(r) for r in roots])
    failed = {e.path for e in errors}
    pending = sorted(
        {t for ms in modules.values() for t, _attr in ms.imports.values()} - set(modules)
    )
    while pending and len(modules) < MAX_FOLLOWED_MODULES:
        jobs = [(p, display_path(Path(p))) for p in pending if resolver.within(Path(p)) and p not in failed]
        if not jobs:
            break
        before = set(modules)
        _scan_all(jobs, roots, modules, errors, overlay)
        failed.update(p for p, _d in jobs if p not in modules)
        new = set(modules) - before
        pending = sorted({t for p in new for t, _attr in modules[p].imports.values()} - set(modules) - failed)


# --------------------------------------------------------------------------- findings


def _suppressed(raw: Raw, modules: dict[str, ModuleSummary]) -> bool:
    """A suppression comment on a line of the finding's site, or of its fix's (``Raw.fix_span``)."""
    spans = [(raw.path, raw.span)]
    if raw.fix_span is not None:
        spans.append((raw.fix_path, raw.fix_span))
    for path, (first, last) in spans:
        ms = modules.get(path)
        if ms is None or not ms.suppress:
            continue
        for line in range(first, max(first, last) + 1):
            codes = ms.suppress.get(line)
            if codes and ("*" in codes or raw.code in codes):
                return True
    return False


def _texts(overlay: Mapping[str, str]) -> Callable[[str], str | None]:
    """The text of a checked file (the overlay's, else read again, once), for the fixes' before/after."""
    cache: dict[str, str | None] = dict(overlay)

    def text_of(path: str) -> str | None:
        if path not in cache:
            cache[path], _err = read_source(Path(path), path)
        return cache[path]

    return text_of


def _filter(raws: list[Raw], modules: dict[str, ModuleSummary], config: Config,
            text_of: Callable[[str], str | None]) -> list[Finding]:
    from gpudoctor.rules.registry import get

    kept = [raw for raw in raws if config.rule_enabled(raw.code) and not _suppressed(raw, modules)]
    out: list[Finding | None] = [None] * len(kept)
    # the before/after are cut in the files' order: the rewrite engine keeps the parts of a file it
    # parsed last, and a rule's findings run through a file once each
    by_place = sorted(range(len(kept)), key=lambda i: (kept[i].fix_path or kept[i].path, _fix_line(kept[i])))
    for i in by_place:
        raw = kept[i]
        out[i] = with_source(
            Finding(
                code=raw.code,
                name=get(raw.code).name,
                severity=raw.severity,
                confidence=Confidence.STATIC,
                message=raw.message,
                fix=raw.fix,
                evidence=raw.evidence,
                gain=Gain(None, None, _GAIN_NOTE),
                location=raw.location,
            ),
            raw.fix_path or raw.path,
            text_of,
            raw.fix_location,
        )
    return [f for f in out if f is not None]


def _fix_line(raw: Raw) -> int:
    loc = raw.fix_location or raw.location
    return loc.line if loc is not None else 0


def _order(f: Finding) -> tuple:
    loc = f.location
    return (f.severity.rank, f.code, loc.file if loc else "", loc.line if loc else 0, (loc.col or 0) if loc else 0)


def _rule_infos(codes: list[str]) -> tuple[RuleInfo, ...]:
    from gpudoctor.rules.registry import get

    infos = []
    for code in codes:
        rule = get(code)
        infos.append(RuleInfo(rule.code, rule.name, rule.title, rule.doc or ""))
    return tuple(infos)


def _training_loops(checks: ProjectContext) -> int:
    """Step loops (a framework's step method counts as its loop), and a framework trainer's loop (HF
    ``Trainer.train()``) in a program with none of its own."""
    loops = checks.step_loops()
    trainers = [
        fn for fn, f in checks.facts("trainer")
        if checks.active(fn, f.ctx) and not any(checks.in_program(fn, [other]) for other, _loop in loops)
    ]
    return len(loops) + len(trainers)


def _summary(
    targets: set[str], modules: dict[str, ModuleSummary], checks: ProjectContext, errors: list[FileError]
) -> tuple[SummaryStat, ...]:
    followed = sum(1 for p in modules if p not in targets)
    return (
        SummaryStat("files_checked", "files checked", len(targets), "files"),
        SummaryStat("files_followed", "project files read through imports", followed, "files"),
        SummaryStat("training_loops", "training loops found", _training_loops(checks), "loops"),
        SummaryStat("files_unreadable", "files not checked (see errors)", len(errors), "files"),
    )

"""What a static check runs against (``StaticContext``) and how a rule declares its part of ``check``.

A rule's static part is a ``StaticCheck``:

- ``check(src)`` reads the project through ``src`` and calls ``src.report(...)`` for
  each problem (a finding before suppression comments and rule selection);
- ``watch``: the facts only this rule needs, recorded for it by the scanner (``scan.py``);
- ``judges``: checklist items it decides from the source when none of their codes
  fired, technique key → ``judge(src) -> (status, reason)``;
- ``recommends(finding)``: whether one of its findings recommends its checklist
  technique (default: every finding does).

``gpudoctor.static`` implements ``StaticContext`` over the linked project and drives
the checks; a rule never imports it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpudoctor.model.findings import ChecklistStatus, Evidence, Finding, Fix, Location, Severity
from gpudoctor.rules.static_api.facts import (
    Ctx,
    Fact,
    Function,
    LoaderFact,
    Loop,
    Resolved,
    Site,
    Sym,
)
from gpudoctor.rules.static_api.scan import Watch
from gpudoctor.rules.static_api.text import NO_CUDA, NO_TRAINING_LOOP, first_of

T = TypeVar("T")

_ENUMERATE = re.compile(r"^for \(?(\w+),.* in enumerate\(")


class StaticContext(ABC):
    """The linked project: its functions and facts, values as the argparse defaults make them,
    its training loops, and where findings go.

    Programs: an entry file (one given on the command line that no other given file
    imports) with the project modules it imports, transitively. "The program of ``fn``"
    is every module that shares a program with ``fn``'s module; facts that judge a whole
    script (CUDA in use, autocast, cudnn.benchmark) are looked up there.

    The lists it returns are shared between the checks: read them, do not change them.
    """

    # ---------------------------------------------------------------- the project

    @abstractmethod
    def functions(self) -> Sequence[Function]:
        """Every function of the project (module top levels included), sorted by ``gid``."""

    @abstractmethod
    def facts(self, kind: str) -> list[tuple[Function, Fact]]:
        """Every fact of a kind: file by file (sorted paths), functions and facts in source order."""

    @abstractmethod
    def program_functions(self, fn: Function) -> list[Function]:
        """The functions of ``fn``'s program, in the order of ``facts``."""

    @abstractmethod
    def program(self, fn: Function) -> int:
        """An id of ``fn``'s program (the modules that share one with ``fn``'s): a check that judges a
        whole program reports once per id."""

    @abstractmethod
    def in_program(self, fn: Function, others: Iterable[Function]) -> bool:
        """Whether any of ``others`` is in ``fn``'s program."""

    @abstractmethod
    def cuda(self, fn: Function) -> bool:
        """Whether ``fn``'s program uses CUDA (``.cuda()``, ``"cuda"``, ``torch.cuda.*``, Accelerate)."""

    @property
    @abstractmethod
    def cuda_anywhere(self) -> bool:
        """Whether any checked program uses CUDA."""

    # ---------------------------------------------------------------- values

    @abstractmethod
    def resolve(self, fn: Function, sym: Sym) -> Resolved:
        """A value of ``fn``'s module as the script runs with its argparse defaults."""

    @abstractmethod
    def active_why(self, fn: Function, ctx: Ctx) -> tuple[bool, list[str]]:
        """Whether code under these ``if`` tests runs with the argparse defaults, and the flags that decide it."""

    def active(self, fn: Function, ctx: Ctx) -> bool:
        """Whether code under these ``if`` tests runs with the argparse defaults."""
        return self.active_why(fn, ctx)[0]

    @abstractmethod
    def loader_value(self, fn: Function, lf: LoaderFact, key: str) -> tuple[str, Resolved | None]:
        """("missing" | "set" | "unknown", resolved value) of a DataLoader argument (``**kwargs`` included)."""

    @abstractmethod
    def loaders(self) -> list[tuple[Function, LoaderFact]]:
        """Every DataLoader construction that runs with the argparse defaults, by function (``gid`` order)."""

    @abstractmethod
    def loader_names(self, fn: Function, lf: LoaderFact) -> set[str]:
        """The names a DataLoader is bound to, its callers' names included when its function returns it."""

    @abstractmethod
    def callee(self, fn: Function, ref: tuple) -> Function | None:
        """The project function a callee reference of ``fn``'s module names (``LoaderFact.worker_init``)."""

    @abstractmethod
    def resolve_bound(
        self, target: Function, sym: Sym, caller: Function, args: tuple[Sym, ...], kwargs: tuple[tuple[str, Sym], ...]
    ) -> Resolved:
        """A value of ``target`` where its parameters are bound in ``caller`` (``functools.partial(target, *args, **kwargs)``)."""

    # ---------------------------------------------------------------- training structure

    @abstractmethod
    def step_loop(self, fn: Function, ctx: Ctx) -> int | None:
        """The step loop a fact runs in every step: its loop id, -1 in a per-step function, None when not per step.

        A loop is a *step loop* when it calls ``.backward()`` / ``optimizer.step()`` (itself or
        through project functions) and no loop inside it does; code under ``if i % N == 0:`` or
        ``if i == 0:`` is not per step.
        """

    @abstractmethod
    def step_loop_ids(self, fn: Function) -> list[int]:
        """The ids of ``fn``'s step loops, sorted."""

    @abstractmethod
    def epoch_loop_ids(self, fn: Function) -> list[int]:
        """The ids of ``fn``'s epoch loops (loops around a step loop, or calling one), sorted."""

    @abstractmethod
    def training_loop_ids(self, fn: Function) -> set[int]:
        """The ids of ``fn``'s loops that contain training (step or epoch loops)."""

    @abstractmethod
    def step_loops(self) -> list[tuple[Function, Loop]]:
        """Every step loop that runs with the argparse defaults, by function (``gid`` order)."""

    @abstractmethod
    def per_step(self, fn: Function) -> bool:
        """Whether ``fn`` runs once per training step (a step loop or a per-step function calls it)."""

    @abstractmethod
    def called_in_loop(self, fn: Function) -> bool:
        """Whether a loop calls ``fn`` (directly or through other functions)."""

    @abstractmethod
    def callers(self, fn: Function) -> list[tuple[Function, Ctx]]:
        """The project functions that call ``fn``, each with the context of the call."""

    @abstractmethod
    def program_trains(self, fn: Function) -> bool:
        """Whether ``fn``'s program has a function with a training loop."""

    def loop(self, fn: Function, lid: int) -> Loop | None:
        """``fn``'s loop with this id."""
        for loop in fn.loops:
            if loop.id == lid:
                return loop
        return None

    def where_step(self, fn: Function, lid: int) -> str:
        """Words for where a per-step fact runs: "the training loop at file:line" (every micro-batch of it
        with gradient accumulation), a framework's step method, or the per-step function."""
        loop = self.loop(fn, lid) if lid >= 0 else None
        if loop is not None and loop.framework:
            return f"`{fn.name}()`, which {loop.framework} runs once per training step"
        if loop is not None:
            where = f"the training loop at {fn.file}:{loop.site.line}"
            steps = [m for m in fn.markers if m.kind == "optimizer.step" and lid in m.ctx.loops]
            if steps and all(lid in m.ctx.periodic for m in steps):
                return f"{where} (every micro-batch: gradient accumulation steps the optimizer every few)"
            return where
        return f"`{fn.name}()`, which runs once per training step"

    def step_counter(self, fn: Function, lid: int) -> str | None:
        """The name that counts the steps of a step loop, for a fix that acts every N steps: the index of
        ``for i, batch in enumerate(loader)``, or the framework's (Lightning's ``batch_idx`` parameter, else
        ``self.global_step``; the HF Trainer's ``self.state.global_step``); None when the code has none."""
        loop = self.loop(fn, lid) if lid >= 0 else None
        if loop is None:
            return None
        if loop.framework:
            params = loop.text.partition("(")[2].rstrip("):").split(", ")
            if "batch_idx" in params:
                return "batch_idx"
            return "self.state.global_step" if "Hugging Face" in loop.framework else "self.global_step"
        m = _ENUMERATE.match(loop.text)
        return m.group(1) if m else None

    # ---------------------------------------------------------------- findings

    def location(self, fn: Function, site: Site) -> Location:
        """A finding's location: ``file:line:col`` in ``fn``."""
        return Location(file=fn.file, line=site.line, col=site.col, function="" if fn.fid == "<module>" else fn.fid)

    def line(self, fn: Function, line: int) -> str:
        """One source line of ``fn``'s module, stripped ("" when it was not kept)."""
        return fn.lines.get(line, "").strip()

    @abstractmethod
    def source(self, fn: Function, site: Site, max_lines: int = 8) -> str:
        """The source at a site, at most ``max_lines`` lines, re-indented for a fix snippet."""

    @abstractmethod
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
        """A finding at ``site`` of ``fn`` (one per code, site and ``fix_at``; later ones are dropped).

        Its evidence notes end with how the script was judged (argparse defaults, a CUDA machine);
        a suppression comment on any line of the site silences it. ``fix_at``: where the fix is, when
        not at the finding (GD301 points at the copy, its fix is on the DataLoader): the fix's
        before/after are made there, and a suppression comment there silences it too.
        """

    @abstractmethod
    def memo(self, key: str, compute: Callable[[], T]) -> T:
        """``compute()`` once per project, for what a rule's check and its judges both read."""

    # ---------------------------------------------------------------- what automatic fixes write

    @abstractmethod
    def sized(self, key: str, fn: Function, site: Site) -> Sized:
        """The value a fix sets ``key`` ("num_workers") to at a site, sized as ``profile`` sizes it: what
        ``--verify`` measured at that call site (``check --from RUN``), else ``check --workers N``, else,
        with nothing measured, the cores of this machine less those kept for the training process.
        ``Sized.refused`` says when the fix is not to be made there (``--verify`` refuted it)."""


@dataclass(frozen=True, slots=True)
class Sized:
    """A value an automatic fix writes (``StaticContext.sized``), and where it comes from."""

    value: Any
    why: str  # "the 2 cores of this machine less 1 for the training process", "--workers 4", "measured by --verify in RUN"
    refused: str = ""  # why the fix is not to be made at this site ("--verify in RUN refuted it"); "" when it is


StaticJudge = Callable[[StaticContext], tuple[ChecklistStatus, str]]


def absent_from_step_loops(what: str) -> StaticJudge:
    """A judge for a checklist item the script applies by *not* doing ``what`` in its training loops
    ("per-step .item() / print(tensor)"): called when the rule's check found none of it, it marks the
    item applied at the loops it looked at; not applicable without a training loop or a CUDA device."""

    def judge(src: StaticContext) -> tuple[ChecklistStatus, str]:
        loops = src.step_loops()
        if not loops:
            return ChecklistStatus.NOT_APPLICABLE, NO_TRAINING_LOOP
        if not src.cuda_anywhere:
            return ChecklistStatus.NOT_APPLICABLE, NO_CUDA
        where = first_of([src.location(fn, loop.site) for fn, loop in loops])
        return ChecklistStatus.APPLIED, f"no {what} in the training loop at {where}"

    return judge


@dataclass(frozen=True, slots=True, eq=False)
class StaticCheck:
    """A rule's part of ``gpudoctor check`` (see the module documentation)."""

    check: Callable[[StaticContext], None] | None = None
    watch: Watch | None = None
    judges: Mapping[str, StaticJudge] = field(default_factory=dict)
    recommends: Callable[[Finding], bool] | None = None


@dataclass(frozen=True, slots=True)
class Example:
    """A script the rule's static check flags (``bad_*.py``) or leaves alone (``good_*.py``).

    ``gpudoctor explain`` prints them, ``docs/rules/<CODE>.md`` shows them, and
    ``python -m gpudoctor.rules.gendocs`` writes them to ``docs/rules/examples/<CODE>/``,
    where the tests run ``gpudoctor check`` on each.
    """

    name: str  # "bad_no_workers.py"
    source: str

    def __post_init__(self) -> None:
        if not self.name.startswith(("bad_", "good_")) or not self.name.endswith(".py"):
            raise ValueError(f"an example is named bad_*.py or good_*.py, not {self.name!r}")

    @property
    def flagged(self) -> bool:
        return self.name.startswith("bad_")


def examples(**sources: str) -> tuple[Example, ...]:
    """``examples(bad_no_workers=\"\"\"…\"\"\", good_workers=\"\"\"…\"\"\")``: file name without ``.py`` → source."""
    return tuple(Example(f"{name}.py", text) for name, text in sources.items())


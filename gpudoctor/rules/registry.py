"""The rule registry: every ``rules/gdNNN_<name>.py`` module defines one ``RULE``.

A rule module looks like::

    \"\"\"GD201 dataloader-stall: the training loop waits for the next batch.

    What it detects
    ---------------
    ...
    \"\"\"
    from gpudoctor.rules.registry import Rule, RuleContext

    def check(ctx: RuleContext) -> RuleResult: ...

    RULE = Rule(code="GD201", name="dataloader-stall", title="...", doc=__doc__, check=check,
                inject=inject,  # or not_injectable="why --verify cannot apply the fix"
                static=StaticCheck(check=static_check, judges={...}),  # its part of `gpudoctor check`
                examples=EXAMPLES)  # the scripts `check` flags and leaves alone

A rule is one room: its documentation, runtime check, static check (written against
``gpudoctor.rules.static_api``), checklist technique and examples live in its module
(``docs/adding-a-rule.md``). Discovery imports every ``gd*`` module of this package
once; codes and names must be unique (a code is never reused).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.needs import Need, as_needs, needs_text, unmet
from gpudoctor.rules.results import RuleResult, Verdict
from gpudoctor.rules.static_api.context import Example, StaticCheck

__all__ = ["Example", "Need", "Rule", "RuleContext", "RuleResult", "StaticCheck", "Verdict", "all_rules", "get", "rule_examples", "static_codes"]


@dataclass(frozen=True, slots=True)
class Rule:
    code: str  # "GD201"
    name: str  # "dataloader-stall"
    title: str  # one line: what it detects
    doc: str  # the module docstring (What it detects / Why it matters / How to fix / …)
    # (RuleContext) -> RuleResult; None for static-only codes. Called as ``rule.check(ctx)`` it answers
    # "cannot judge" for a missing need without running the rule's own function (``body``)
    check: Callable[[Any], Any] | None = None
    # the evidence it judges from (rules.needs.Need; `gpudoctor rules` lists them). Before its function
    # runs (engine.run_rules), the first one missing, in Need's order, makes its result "cannot judge" with
    # the reason (its own words in ``needs_reasons``, else the need's): the function never checks them,
    # except those in ``self_checked``, whose absence it answers itself (a fallback to other evidence, or
    # "not applicable")
    needs: frozenset[Need] = frozenset()
    self_checked: frozenset[Need] = frozenset()
    needs_reasons: dict[Need, str] = field(default_factory=dict, hash=False, compare=False)
    # --verify: (Finding, RuleContext) -> the changes that apply the finding's fix to a trial run of the
    # unmodified script (tuple of model.Injection), or a string saying why this finding's fix cannot be
    # applied that way. None: no fix of this rule can be (``not_injectable`` says why).
    inject: Callable[[Any, Any], Any] | None = None
    not_injectable: str = ""  # why --verify does not try this rule's fixes (a source edit, changed numerics …)
    # --verify compares each trial run's time per step (total ÷ steps: throughput) over its steady steps,
    # the first step of each epoch left out as a one-off cost: "throughput". A rule asks for another
    # statistic only with a reason, given beside it: "epoch" keeps the epoch starts in the total (a fix
    # whose gain falls there: GD202's worker start-up)
    verify_statistic: str = "throughput"
    # the checklist item of a rule outside the seed checklist's techniques (rules.checklist.TECHNIQUES): the
    # technique that answers it, named as what to do ("Keep results on the GPU between steps"), not as the
    # problem its title names
    technique: str = ""
    # its part of `gpudoctor check`: the static check, the facts it has the scanner record, the checklist
    # items it judges from the source (gpudoctor.rules.static_api); None when `check` cannot see it
    static: StaticCheck | None = None
    # scripts its static check flags (bad_*.py) and leaves alone (good_*.py): `explain` prints them,
    # docs/rules shows them, the tests check them
    examples: tuple[Example, ...] = ()
    # `gpudoctor check --fix`: True when the edits of its findings' fixes (Fix.edits) are mechanical and safe,
    # so that --fix writes them (docs/check.md); else ``not_autofix`` says why --fix leaves the change to you
    # (AMP changes numerics, a launcher is needed …). A rule with a static check declares one of the two
    autofix: bool = False
    not_autofix: str = ""

    def __post_init__(self) -> None:
        needs, own = as_needs(self.needs), as_needs(self.self_checked)
        if not own <= needs or not set(self.needs_reasons) <= needs - own:
            raise ValueError(f"{self.code}: self_checked and needs_reasons name needs the engine checks")
        if self.autofix and self.not_autofix:
            raise ValueError(f"{self.code}: autofix and not_autofix both given; declare one")
        object.__setattr__(self, "needs", needs)
        object.__setattr__(self, "self_checked", own)
        if self.check is not None:
            object.__setattr__(self, "check", _checking_needs(getattr(self.check, "__wrapped__", self.check),
                                                              needs - own, dict(self.needs_reasons)))

    @property
    def body(self) -> Callable[[Any], Any] | None:
        """The rule's own function, which runs once every need is met."""
        return getattr(self.check, "__wrapped__", self.check)

    def unmet(self, ctx: RuleContext) -> str | None:
        """Why ``ctx``'s run lacks what this rule needs (the first missing need's reason); None when it has it."""
        return unmet(self.needs - self.self_checked, ctx, self.needs_reasons)

    @property
    def needs_text(self) -> str:
        """Its needs as the catalogue lists them: ``gpu, trace, shapes``."""
        return needs_text(self.needs)

    @property
    def group(self) -> int:
        """Hundreds: 1 GPU utilization/sync, 2 input pipeline, 3 transfers, 4 kernels/precision, 5 memory, 6 distributed, 7 eval."""
        return int(self.code[2])


def _checking_needs(body: Callable[[Any], Any], needs: frozenset[Need], reasons: dict[Need, str]) -> Callable[[Any], Any]:
    """``body`` behind its needs: "cannot judge" with the first missing need's reason, else ``body(ctx)``."""

    @functools.wraps(body)
    def check(ctx: RuleContext) -> Any:
        why = unmet(needs, ctx, reasons)
        return RuleResult.cannot_judge(why) if why is not None else body(ctx)

    return check


@cache
def all_rules() -> tuple[Rule, ...]:
    """Every rule, sorted by code."""
    package = __name__.rpartition(".")[0]  # gpudoctor.rules, found without importing it back (no cycle)
    found: dict[str, Rule] = {}
    names: set[str] = set()
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.name.startswith("gd"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        rule = module.RULE
        if rule.code in found or rule.name in names:
            raise RuntimeError(f"duplicate rule code or name: {rule.code} {rule.name}")
        if not info.name.startswith(rule.code.lower() + "_"):
            raise RuntimeError(f"module {info.name} must be named {rule.code.lower()}_<name>")
        found[rule.code] = rule
        names.add(rule.name)
    return tuple(found[c] for c in sorted(found))


def rule_examples(rule: Rule, root: Path | None = None) -> tuple[list[Example], list[Example]]:
    """The static-check examples of a rule: (bad, good), sorted by name.

    They are the rule's own (``Rule.examples``); an example file that a docs tree holds beside
    them (``<root>/<CODE>/bad_*.py``, ``gpudoctor.rules.examples_dir()`` in a checkout) is shown too."""
    found = {e.name: e for e in rule.examples}
    folder = root / rule.code if root is not None else None
    if folder is not None and folder.is_dir():
        for path in sorted(folder.glob("*.py")):
            if path.name not in found and path.name.startswith(("bad_", "good_")):
                found[path.name] = Example(path.name, path.read_text(encoding="utf-8"))
    ordered = [found[name] for name in sorted(found)]
    return [e for e in ordered if e.flagged], [e for e in ordered if not e.flagged]


def static_codes() -> tuple[str, ...]:
    """The codes `gpudoctor check` can report: the rules with a static check, sorted."""
    return tuple(r.code for r in all_rules() if r.static is not None and r.static.check is not None)


def get(code: str) -> Rule:
    """The rule with this code (case-insensitive) or name; KeyError when there is none."""
    key = code.strip()
    for rule in all_rules():
        if rule.code == key.upper() or rule.name == key.lower():
            return rule
    raise KeyError(code)

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
                inject=inject)  # or not_injectable="why --verify cannot apply the fix"

Discovery imports every ``gd*.py`` module of this package once; codes and names
must be unique (a code is never reused).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from gpudoctor.rules.context import RuleContext, RuleResult, Verdict

__all__ = ["Rule", "RuleContext", "RuleResult", "Verdict", "all_rules", "get"]


@dataclass(frozen=True, slots=True)
class Rule:
    code: str  # "GD201"
    name: str  # "dataloader-stall"
    title: str  # one line: what it detects
    doc: str  # the module docstring (What it detects / Why it matters / How to fix / …)
    check: Callable[[Any], Any] | None = None  # (RuleContext) -> RuleResult; None for static-only codes
    needs: tuple[str, ...] = ()  # what it must have to judge: "gpu", "trace", "steps", "settings", "stacks", "shapes", "samples"
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

    @property
    def group(self) -> int:
        """Hundreds: 1 GPU utilization/sync, 2 input pipeline, 3 transfers, 4 kernels/precision, 5 memory, 6 distributed, 7 eval."""
        return int(self.code[2])


@cache
def all_rules() -> tuple[Rule, ...]:
    """Every rule, sorted by code."""
    from gpudoctor import rules as package

    found: dict[str, Rule] = {}
    names: set[str] = set()
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("gd"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        rule = module.RULE
        if rule.code in found or rule.name in names:
            raise RuntimeError(f"duplicate rule code or name: {rule.code} {rule.name}")
        if not info.name.startswith(rule.code.lower() + "_"):
            raise RuntimeError(f"module {info.name} must be named {rule.code.lower()}_<name>")
        found[rule.code] = rule
        names.add(rule.name)
    return tuple(found[c] for c in sorted(found))


def get(code: str) -> Rule:
    """The rule with this code (case-insensitive) or name; KeyError when there is none."""
    key = code.strip()
    for rule in all_rules():
        if rule.code == key.upper() or rule.name == key.lower():
            return rule
    raise KeyError(code)

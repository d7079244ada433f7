"""The shared fact API that the rules' static checks (``gpudoctor check``) are written against.

A rule module holds its static part next to its runtime check: a ``StaticCheck``
given to its ``Rule`` as ``static=``, and its ``examples``. This package is all it
imports for that; ``gpudoctor.static`` (the scanner, the linker, the driver)
implements it and is never imported by a rule, so the layers stay one-way:
``static/`` imports ``rules/``, not the reverse.

- ``facts``: the records (``Site``, ``Ctx``, ``Loop``, ``LoaderFact``, ``Fact``,
  ``Function`` …) and values (``Sym``, ``Resolved``);
- ``context``: ``StaticContext``, what a check runs against; ``StaticCheck``;
  ``Example``;
- ``scan``: ``Watch``, the facts a rule asks the scanner to record for it, and
  ``Scan``, what its hooks may ask the scanner;
- ``text``: ``file:line``, settings as text, fix snippets;
- ``names``: PyTorch names shared by the scanner and the checks.

``docs/adding-a-rule.md`` walks through one rule's module.
"""

from __future__ import annotations

from gpudoctor.rules.static_api.context import (
    Example,
    Sized,
    StaticCheck,
    StaticContext,
    StaticJudge,
    absent_from_step_loops,
    examples,
)
from gpudoctor.rules.static_api.facts import (
    POSITIVE_VALUE,
    TENSOR_DEVICE,
    UNKNOWN,
    UNKNOWN_VALUE,
    Ctx,
    Fact,
    Function,
    LoaderFact,
    Loop,
    Marker,
    Resolved,
    Site,
    Sym,
    Transfer,
    const,
    const_value,
    is_const,
    sym_any,
    sym_in,
)
from gpudoctor.rules.static_api.scan import Scan, Watch, dotted, last, root_name

__all__ = [
    "POSITIVE_VALUE",
    "TENSOR_DEVICE",
    "UNKNOWN",
    "UNKNOWN_VALUE",
    "Ctx",
    "Example",
    "Fact",
    "Function",
    "LoaderFact",
    "Loop",
    "Marker",
    "Resolved",
    "Scan",
    "Site",
    "Sized",
    "StaticCheck",
    "StaticContext",
    "StaticJudge",
    "Sym",
    "Transfer",
    "Watch",
    "absent_from_step_loops",
    "const",
    "const_value",
    "dotted",
    "examples",
    "is_const",
    "last",
    "root_name",
    "sym_any",
    "sym_in",
]

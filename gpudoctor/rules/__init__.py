"""One rule per module (``gdNNN_<name>.py``); see ``registry``.

``catalogue_table()`` is what ``gpudoctor rules`` prints; ``explain(code)`` is what
``gpudoctor explain CODE`` prints: the rule's docstring and its static-check examples
(``Rule.examples``, in the rule's module).
"""

from __future__ import annotations

from pathlib import Path

from gpudoctor.errors import UsageError

#: Reserved for a rule that crashed: the engine reports it as a finding with this code.
INTERNAL_ERROR_CODE = "GD000"
INTERNAL_ERROR_NAME = "internal-error"

_GROUPS = {
    1: "GPU utilization and synchronization",
    2: "input pipeline",
    3: "host-device transfers",
    4: "kernels and precision",
    5: "memory",
    6: "distributed",
    7: "evaluation and inference",
}


def group_title(group: int) -> str:
    return _GROUPS.get(group, "other")


def catalogue_table() -> str:
    """The rule catalogue as a plain-text table: code, name, what it detects, what it needs."""
    from gpudoctor.rules.registry import all_rules

    rules = all_rules()
    rows = [("CODE", "NAME", "DETECTS", "NEEDS")]
    rows += [(r.code, r.name, r.title, r.needs_text or "-") for r in rules]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    lines: list[str] = []
    group = None
    for i, (code, name, title, needs) in enumerate(rows):
        if i > 0:
            g = int(code[2])
            if g != group:
                group = g
                lines.append(f"  {code[:3]}xx {group_title(g)}")
        lines.append(f"{code:<{w0}}  {name:<{w1}}  {title:<{w2}}  {needs}".rstrip())
    lines.append("")
    lines.append(f"{len(rules)} rules. `gpudoctor explain CODE` prints one rule's documentation.")
    return "\n".join(lines)


def examples_dir() -> Path:
    """``docs/rules/examples`` of the source tree (present in a checkout, not in a wheel): the rules'
    examples as files, written by ``python -m gpudoctor.rules.gendocs`` for the tests to check."""
    return Path(__file__).resolve().parents[2] / "docs" / "rules" / "examples"


def explain(code: str) -> str:
    """A rule's documentation (its docstring), and its `gpudoctor check` examples when present.

    An unknown code raises ``UsageError`` saying how to see the catalogue.
    """
    from gpudoctor.rules.registry import get, rule_examples

    key = code.strip()
    if key.upper() == INTERNAL_ERROR_CODE:
        return (
            f"{INTERNAL_ERROR_CODE} {INTERNAL_ERROR_NAME}: a rule of gpudoctor crashed on this run.\n\n"
            "The report still lists every other rule's findings; the crashed rule's checklist entry says\n"
            "\"not measurable here\". It is a bug in gpudoctor: please report it with the message\n"
            "(set GPUDOCTOR_DEBUG=1 to make the crash raise with its traceback)."
        )
    try:
        rule = get(key)
    except KeyError:
        raise UsageError(
            f"unknown rule {code!r}: run `gpudoctor rules` to list the catalogue (codes like GD201 or names like dataloader-stall)"
        ) from None
    text = (rule.doc or rule.title).strip()
    bad, good = rule_examples(rule, examples_dir())
    if bad or good:
        parts = [text, "", "Examples (`gpudoctor check`)", "----------------------------"]
        for label, examples in (("flagged", bad), ("not flagged", good)):
            for e in examples:
                parts += ["", f"{e.name} ({label}):", "", e.source.rstrip()]
        text = "\n".join(parts)
    return text + "\n"

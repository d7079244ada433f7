"""One account of the step: exclusive gains and the projection (docs/account.md).

Rules claim parts of a ledger (``RuleContext.finding(claims=…)``); ``assign_gains`` hands
each part of each ledger out once, to its claimants in the order of ``OWNERS`` (the rule
whose fix removes the whole part first; between two such rules the larger win), so no
two findings gain the same nanoseconds. A claimant that finds its part taken shows
"included in GDnnn". ``build_account`` makes the account a report opens with: the
primary ledger, its headline (the GPU-idle or host-bound account and its causes), and
the top actions with the step time after each, cumulatively.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from gpudoctor.model.findings import Account, Action, Finding
from gpudoctor.model.metrics import COMPONENT_LABELS, Component, Ledger
from gpudoctor.rules.context import RuleContext, fmt_ns, median_int

C = Component

#: Who owns each part when several findings claim it, owner first (docs/account.md).
OWNERS: dict[Component, tuple[str, ...]] = {
    C.DATA_LOADING: ("GD201",),
    C.SYNC_WAIT: ("GD102", "GD302"),
    C.LAUNCH_OVERHEAD: ("GD103", "GD104"),
    C.OPTIMIZER: ("GD404", "GD103"),
    C.GPU_OPTIMIZER: ("GD404",),
    C.OTHER_CPU: ("GD203", "GD702", "GD502"),
    C.GPU_FP32_MATMUL: ("GD401", "GD402"),
    C.GPU_FP32_CONV: ("GD401", "GD403"),
    C.GPU_CONV: ("GD403",),
    C.H2D: ("GD301",),
    C.D2H: ("GD303", "GD702"),
    C.COMM_EXPOSED: ("GD602", "GD604"),
}

HEADLINE_CODES = ("GD101",)
TOP_ACTIONS = 5
_MIN_CAUSE_PCT = 0.5  # causes below this share of the step are left out of the headline
_MIN_ACTION_PCT = 0.05  # a gain that shows as 0.0% is no action


def label(component: str) -> str:
    return COMPONENT_LABELS.get(component, component.replace("_", " "))


def _owner_rank(code: str, component: str) -> tuple[int, str]:
    """Where a rule stands among the claimants of a part: by ``OWNERS``, then by code."""
    try:
        order = OWNERS.get(Component(component), ())
    except ValueError:
        order = ()
    return (order.index(code) if code in order else len(order), code)


def assign_gains(ctx: RuleContext, findings: list[Finding]) -> list[Finding]:
    """Grant each claimed part of each ledger once, in ``OWNERS`` order; recompute each claiming
    finding's share of step time, speed-up bound and severity from what it was granted."""
    by_part: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)  # (ledger, part) -> [(finding, claim)]
    for i, f in enumerate(findings):
        for j, c in enumerate(f.gain.claims):
            by_part[(c.ledger, c.component)].append((i, j))
    granted: dict[tuple[int, int], int] = {}
    owners: dict[tuple[int, int], list[str]] = defaultdict(list)
    for (_, part), claims in by_part.items():
        claims.sort(key=lambda ij: (*_owner_rank(findings[ij[0]].code, part), ij[0]))
        left = findings[claims[0][0]].gain.claims[claims[0][1]].part_ns
        taken_by: list[str] = []
        for i, j in claims:
            c = findings[i].gain.claims[j]
            take = max(0, min(c.requested_ns, left))
            granted[(i, j)] = take
            if take < c.requested_ns:
                owners[(i, j)] = [code for code in taken_by if code != findings[i].code]
            left -= take
            if take > 0:
                taken_by.append(findings[i].code)
    out = []
    for i, f in enumerate(findings):
        if not f.gain.claims:
            out.append(f)
            continue
        claims = tuple(replace(c, granted_ns=granted[(i, j)]) for j, c in enumerate(f.gain.claims))
        total = claims[0].total_ns
        share = 100.0 * sum(c.granted_ns for c in claims) / total if total else 0.0
        included = tuple(dict.fromkeys(code for j in range(len(claims)) for code in owners.get((i, j), [])))
        note = f.gain.note
        if included:
            note = (note + "; " if note else "") + "included in " + ", ".join(included) + " (its fix wins that time first)"
        gain = RuleContext.gain(share, note, f.gain.expected_fraction, f.gain.expected_note)
        out.append(
            replace(
                f,
                severity=ctx.severity(share),
                gain=replace(gain, claims=claims, included_in=included),
            )
        )
    return out


def _expected_pct(f: Finding, granted_pct: float) -> float | None:
    """The expected share of one ledger's step a finding's fix wins: its rule's fraction of what it was
    granted there (None without a model)."""
    frac = f.gain.expected_fraction
    return None if frac is None else granted_pct * frac


def is_headline(f: Finding) -> bool:
    return f.code in HEADLINE_CODES


def point_headline(ctx: RuleContext, findings: list[Finding]) -> list[Finding]:
    """GD101's message and fix name the findings that were granted its causes (parts of the GPU
    idle time of the same ledger), largest first: they are the causes, GD101 the headline."""
    out = []
    for f in findings:
        if not is_headline(f):
            out.append(f)
            continue
        ledger = ctx.ledger(ctx.primary_trace(f.rank))
        key = ledger.key if ledger is not None else ""
        causes: dict[str, float] = {}
        for g in findings:
            if g is f or is_headline(g):
                continue
            pct = _granted_pct(g, key)
            if pct > 0:
                causes[g.code] = causes.get(g.code, 0.0) + pct
        if causes:
            ranked = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
            names = ", ".join(f"{code} ({pct:.1f}% of step time)" for code, pct in ranked)
            f = replace(
                f,
                message=f"{f.message}; the causes are findings {names}",
                fix=replace(f.fix, instruction=f"Fix its causes, largest first: {', '.join(c for c, _ in ranked)}."),
            )
        else:
            f = replace(
                f,
                fix=replace(
                    f.fix,
                    instruction=f.fix.instruction + " No rule of this report claims these causes: the idle gaps of "
                    "the evidence show what the host was doing.",
                ),
            )
        out.append(f)
    return out


_HOST_PARTS = frozenset(
    c.value for c in (C.DATA_LOADING, C.SYNC_WAIT, C.LAUNCH_OVERHEAD, C.OPTIMIZER, C.OTHER_CPU, C.DEPENDENCY_WAIT)
)


def _granted_pct(f: Finding, ledger_key: str) -> float:
    """The share of the GPU idle time of one ledger granted to a finding."""
    return sum(
        100.0 * c.granted_ns / c.total_ns
        for c in f.gain.claims
        if c.total_ns and c.ledger == ledger_key and c.component in _HOST_PARTS
    )


# --------------------------------------------------------------------------- the account


def headline(ledger: Ledger) -> str:
    """"GPU idle 67.4% of step time: waiting for the DataLoader 50.5%, other host work 14.9%" on a
    GPU ledger; "CPU-bound (no GPU activity): …" on a CPU ledger; the steps' split otherwise."""
    host = sorted((s for s in ledger.slices if s.side == "host"), key=lambda s: (-s.ns, s.component))
    causes = ", ".join(f"{label(s.component)} {s.pct:.1f}%" for s in host if s.pct >= _MIN_CAUSE_PCT)
    if ledger.basis == "gpu":
        idle = ledger.idle_pct
        busy = sorted((s for s in ledger.slices if s.side == "device"), key=lambda s: (-s.ns, s.component))
        top_busy = ", ".join(f"{label(s.component)} {s.pct:.1f}%" for s in busy[:3] if s.pct >= _MIN_CAUSE_PCT)
        text = f"GPU idle {idle:.1f}% of step time" + (f": {causes}" if causes else "")
        return text + (f"; busy with {top_busy}" if top_busy else "")
    if ledger.basis == "cpu" or any(s.source == "trace, scaled" for s in ledger.slices):
        return f"host-bound (no GPU activity): {causes}" if causes else "host-bound (no GPU activity)"
    return f"step time over {ledger.window}: {causes}" if causes else f"step time over {ledger.window}"


def _step_time(ctx: RuleContext, ledger: Ledger) -> tuple[int | None, str]:
    steps = ctx.steady_steps_of(ledger.rank)
    med = median_int(s.wall_ns for s in steps)
    if med:
        return med, f"median of {len(steps)} steady steps"
    if ledger.windows:
        return int(round(ledger.step_ns)), f"mean of {ledger.window}"
    return None, ""


def build_account(ctx: RuleContext, findings: list[Finding]) -> Account | None:
    """The account of the primary ledger (rank 0's, or the run's steps), from the findings as
    granted (``assign_gains`` first)."""
    ledger = ctx.ledger()
    if ledger is None or ledger.total_ns <= 0:
        return None
    step_ns, source = _step_time(ctx, ledger)
    mine = [f for f in findings if any(c.ledger == ledger.key for c in f.gain.claims)]
    gained = [(f, sum(100.0 * c.granted_ns / c.total_ns for c in f.gain.claims if c.ledger == ledger.key))
              for f in mine]
    gained = [(f, pct, _expected_pct(f, pct)) for f, pct in gained if pct >= _MIN_ACTION_PCT]
    # ranked by what the fix is expected to win (its rule's model), the bound where a rule has none
    gained.sort(key=lambda fpe: (-(fpe[2] if fpe[2] is not None else fpe[1]), -fpe[1], fpe[0].code))
    actions = []
    left = left_expected = 100.0
    for f, pct, exp in gained[:TOP_ACTIONS]:
        left -= pct
        left_expected -= exp if exp is not None else pct
        after = int(round(step_ns * max(left, 0.0) / 100.0)) if step_ns else 0
        expected_after = int(round(step_ns * max(left_expected, 0.0) / 100.0)) if step_ns else None
        comps = tuple(c.component for c in f.gain.claims if c.granted_ns > 0)
        actions.append(Action(f.code, f.name, round(pct, 4), after, f.rank, comps,
                              round(exp, 4) if exp is not None else None, expected_after))
    claimed = round(sum(pct for _, pct, _ in gained), 4)
    notes = [
        "each action's expected gain is its rule's model (its documentation states it); the bound is its whole "
        "exclusive share of the step, after the ones before it: the step after a fix is at least the bound's "
        "figure (a fix shortens its part; it may not remove it)"
    ]
    if ledger.basis == "gpu":
        notes.append("GPU idle time is won only by host-side fixes, kernel time only by faster kernels (docs/account.md)")
    if step_ns and source.startswith("median") and ledger.basis != "steps":
        notes.append(f"shares of {ledger.window}, applied to the {source} ({fmt_ns(step_ns)})")
    if len({mm.rank for mm in ctx.metrics}) > 1:
        notes.append(f"{ledger.label}'s account; every rank's findings claim from its own trace")
    return Account(
        headline=headline(ledger),
        ledger=ledger,
        step_ns=step_ns,
        step_source=source,
        actions=tuple(actions),
        claimed_pct=claimed,
        notes=tuple(notes),
    )


__all__ = ["OWNERS", "assign_gains", "build_account", "headline", "is_headline", "label", "point_headline"]

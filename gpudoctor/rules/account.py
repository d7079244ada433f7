"""One account of the step: exclusive gains and the projection (docs/account.md).

Rules claim parts of a ledger (``RuleContext.finding(claims=…)``); ``assign_gains`` hands
each part of each ledger out once, to its claimants in the order of ``OWNERS`` (the rule
whose fix removes the whole part first; between two such rules the larger win: on the
device-busy parts, which no fix removes, the larger expected win), so no two findings gain
the same nanoseconds. A claimant that finds its part taken shows
"included in GDnnn". ``build_account`` makes the account a report opens with: the
primary ledger, its headline (the GPU-idle or host-bound account and its causes), and
the top actions with the step time after each, cumulatively.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from gpudoctor.model.findings import Account, Action, Finding
from gpudoctor.model.metrics import COMPONENT_LABELS, Component, Ledger, LedgerBasis, SliceSource
from gpudoctor.model.units import duration_text
from gpudoctor.model.verify import VerifyStatus
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import fmt_ns

C = Component

#: Who owns each part when several findings claim it, owner first (docs/account.md).
OWNERS: dict[Component, tuple[str, ...]] = {
    C.DATA_LOADING: ("GD201",),
    C.SYNC_WAIT: ("GD102", "GD302"),
    C.LAUNCH_OVERHEAD: ("GD103", "GD104"),
    C.OPTIMIZER: ("GD404", "GD103"),
    C.GPU_OPTIMIZER: ("GD404",),
    # the measured causes first (the allocator's calls, the loss on the host: each claims only its own
    # time), then the loop's Python as a whole (GD203 claims the whole part, whatever its cause)
    C.OTHER_CPU: ("GD502", "GD702", "GD203"),
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


#: Device-busy parts: no fix removes them (faster kernels shorten them), so their claimants are granted
#: in the order of the share each expects to win (its rule's model), ``OWNERS`` breaking ties.
BY_EXPECTED: frozenset[Component] = frozenset({C.GPU_FP32_CONV, C.GPU_FP32_MATMUL, C.GPU_CONV, C.GPU_MATMUL,
                                               C.GPU_COMPUTE})


def _owner_rank(code: str, component: str) -> tuple[int, str]:
    """Where a rule stands among the claimants of a part: by ``OWNERS``, then by code."""
    try:
        order = OWNERS.get(Component(component), ())
    except ValueError:
        order = ()
    return (order.index(code) if code in order else len(order), code)


def _claim_order(f: Finding, component: str) -> tuple:
    """Who is granted a part first: for a device-busy part (``BY_EXPECTED``) the larger expected fraction
    (a model before none), then ``OWNERS``; for any other part ``OWNERS`` alone."""
    try:
        by_expected = Component(component) in BY_EXPECTED
    except ValueError:
        by_expected = False
    frac = f.gain.expected_fraction
    first = (frac is None, -(frac or 0.0)) if by_expected else (False, 0.0)
    return (*first, *_owner_rank(f.code, component))


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
        claims.sort(key=lambda ij: (*_claim_order(findings[ij[0]], part), ij[0]))
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
                severity=ctx.severity_of(share, gain),
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
    """A headline claims no part of a ledger itself: the findings granted the parts it heads are its
    causes (GD101: the GPU idle time) or its fixes (``Gain.heads``: GD405's precision-capped kernels)."""
    return f.code in HEADLINE_CODES or bool(f.gain.heads)


def point_headline(ctx: RuleContext, findings: list[Finding]) -> list[Finding]:
    """A headline's message and fix name the findings that were granted the parts it heads (GD101: the
    GPU idle time of the same ledger; a finding with ``Gain.heads``: those parts), largest first: they are
    its causes or its fixes, the headline is the account of them."""
    out = []
    for f in findings:
        if not is_headline(f):
            out.append(f)
            continue
        ledger = ctx.ledger(ctx.primary_trace(f.rank))
        key = ledger.key if ledger is not None else ""
        parts = frozenset(f.gain.heads) or _HOST_PARTS
        causes: dict[str, float] = {}
        for g in findings:
            if g is f or is_headline(g):
                continue
            pct = _granted_pct(g, key, parts)
            if pct > 0:
                causes[g.code] = causes.get(g.code, 0.0) + pct
        what = "fixes" if f.gain.heads else "causes"
        if causes:
            ranked = sorted(causes.items(), key=lambda kv: (-kv[1], kv[0]))
            names = ", ".join(f"{code} ({pct:.1f}% of step time)" for code, pct in ranked)
            codes = ", ".join(c for c, _ in ranked)
            f = replace(
                f,
                message=f"{f.message}; the {what} are findings {names}",
                fix=replace(f.fix, instruction=f"Fix its causes, largest first: {codes}." if not f.gain.heads
                            else f"Apply its fixes, largest first: {codes}. {f.fix.instruction}"),
            )
        else:
            tail = (" No rule of this report claims these causes: the idle gaps of the evidence show what the host "
                    "was doing." if not f.gain.heads else " No other finding of this report claims this time.")
            f = replace(f, fix=replace(f.fix, instruction=f.fix.instruction + tail))
        out.append(f)
    return out


_HOST_PARTS = frozenset(
    c.value for c in (C.DATA_LOADING, C.SYNC_WAIT, C.LAUNCH_OVERHEAD, C.OPTIMIZER, C.OTHER_CPU, C.DEPENDENCY_WAIT)
)


def _granted_pct(f: Finding, ledger_key: str, parts: frozenset[str] = _HOST_PARTS) -> float:
    """The share of some parts of one ledger (default: the GPU idle time) granted to a finding."""
    return sum(
        100.0 * c.granted_ns / c.total_ns
        for c in f.gain.claims
        if c.total_ns and c.ledger == ledger_key and c.component in parts
    )


# --------------------------------------------------------------------------- the account


def headline(ledger: Ledger) -> str:
    """"GPU idle 67.4% of step time: waiting for the DataLoader 50.5%, other host work 14.9%" on a
    GPU ledger whose steps the host limits; "the GPU is the bottleneck: busy 99.9% of the device's
    step; the host runs 625 ms ahead; …" on one whose steps the device limits (and how many of each
    where they mix); "CPU-bound (no GPU activity): …" on a CPU ledger; the steps' split otherwise."""
    host = sorted((s for s in ledger.slices if s.side == "host"), key=lambda s: (-s.ns, s.component))
    causes = ", ".join(f"{label(s.component)} {s.pct:.1f}%" for s in host if s.pct >= _MIN_CAUSE_PCT)
    if ledger.basis == LedgerBasis.GPU:
        idle = ledger.idle_pct
        busy = sorted((s for s in ledger.slices if s.side == "device"), key=lambda s: (-s.ns, s.component))
        top_busy = ", ".join(f"{label(s.component)} {s.pct:.1f}%" for s in busy[:3] if s.pct >= _MIN_CAUSE_PCT)
        if ledger.device_windows and ledger.device_windows == ledger.windows:
            # every step runs behind the host: the device's timeline is the step (docs/account.md)
            # the lead to three figures, as the trace's notes give it: one value of one quantity
            lead = f"; the host runs {duration_text(ledger.lead_ns)} ahead" if ledger.lead_ns else ""
            text = f"the GPU is the bottleneck: busy {100.0 - idle:.1f}% of the device's step{lead}"
            text += f"; busy with {top_busy}" if top_busy else ""
            return text + (f"; idle {idle:.1f}%: {causes}" if causes else "")
        text = f"GPU idle {idle:.1f}% of step time" + (f": {causes}" if causes else "")
        text += f"; busy with {top_busy}" if top_busy else ""
        if ledger.device_windows:
            text = (f"the GPU limits {ledger.device_windows} of {ledger.windows} steps, the host the other "
                    f"{ledger.windows - ledger.device_windows}: " + text)
        return text
    if ledger.basis == LedgerBasis.CPU or any(s.source == SliceSource.TRACE_SCALED for s in ledger.slices):
        return f"host-bound (no GPU activity): {causes}" if causes else "host-bound (no GPU activity)"
    return f"step time over {ledger.window}: {causes}" if causes else f"step time over {ledger.window}"


def settling_notes(ctx: RuleContext, ledger: Ledger) -> list[str]:
    """What the account says of a run whose step time changed midway (``RuleContext.settling``): the change,
    and, where the loop settled, whether the account's trace windows recorded the settled part (the step
    time and the account's steps are of it; a window recorded before it split another loop's step)."""
    settled = ctx.settling()
    if settled is None:
        return []
    notes = [f"step time changed: {settled.text()}"]
    first = settled.first_settled
    recorded = sorted({w.step for m in ctx.accounting_traces() if m.rank == ledger.rank and m.ledger is not None
                       for w in m.steps})
    if first is not None and recorded and ledger.basis != LedgerBasis.STEPS and recorded[-1] < first:
        notes.append(f"the account's trace recorded steps {recorded[0]}–{recorded[-1]}, before the loop settled at "
                     f"step {first}: its split of the step is the unsettled loop's (profile more steps, --steps, "
                     "for a window after it)")
    return notes


def weight_note(ledger: Ledger, max_ratio: float) -> str:
    """What the report says of the accounting window's weight (docs/account.md, "The accounting window"):
    "profiled steps ran 1.20× the unprofiled ones (…)", and whether the host-side work was scaled."""
    w = ledger.weight
    if w is None:
        return ""
    whose = "" if ledger.basis != LedgerBasis.STEPS else " (their trace splits the rest)"
    text = (f"profiled steps{whose} ran {w.ratio:.2f}× the unprofiled ones (median of the {w.window_steps} the account's "
            f"window recorded, {fmt_ns(w.window_step_ns)}, over the median of {w.bare_steps} unprofiled steady steps, "
            f"{fmt_ns(w.bare_step_ns)}" + (f"; {w.source}" if w.source != "wall" else "; wall time") + ")")
    if w.scaled:
        n = w.scaled_windows or w.window_steps
        of = (f"the {n} windows of its trace, whose split of the steps' time it scales" if ledger.basis == LedgerBasis.STEPS
              else f"its {n} windows")
        kept = ["the device's busy time"] if ledger.basis == LedgerBasis.GPU else []
        if w.waits_removed_ns:
            waits = (f"; the host's work could not hold it all: {fmt_ns(w.waits_removed_ns)} of it came out of "
                     "the waits (for a batch, a synchronization, another stream)")
        else:
            kept.append("the waits")
            waits = ""
        verb = "is" if kept == ["the device's busy time"] else "are"  # "the waits" are
        as_recorded = f"; {' and '.join(kept)} {verb} as recorded" if kept else ""
        return (text + f": above {max_ratio:.2f}×, the host-side work of the account (launch and dispatch, Python "
                f"and CPU ops, the optimizer on the host) is scaled to the unprofiled step: {fmt_ns(w.removed_ns)} "
                f"of profiler time taken out of {of}" + as_recorded + waits)
    if w.ratio < 1.0 / max_ratio:  # faster under the profiler: no instrument does that, the loop changed
        return text + (f": under 1/{max_ratio:.2f}×, the profiled steps ran faster than the unprofiled ones, which "
                       "no instrument causes: the loop ran at another speed while the window recorded it (a warm-up "
                       "or a phase the unprofiled steps do not share); the account is as recorded, of the window's steps")
    return text + f": within {max_ratio:.2f}×, the account is as recorded"


def _measured_pct(f: Finding) -> float | None:
    """A confirmed fix's measured gain as a share of step time (``1 - 1/speed-up``), None otherwise."""
    v = f.verification
    if v is None or v.status != VerifyStatus.CONFIRMED or not v.speedup or v.speedup <= 1.0:
        return None
    return 100.0 * (1.0 - 1.0 / v.speedup)


def _refuted(f: Finding) -> bool:
    return f.verification is not None and f.verification.status == VerifyStatus.REFUTED


def account_ledger(ctx: RuleContext, slowest_rank: int | None = None) -> Ledger | None:
    """The ledger the account leads with: the slowest rank's in a job of several ranks (in synchronous
    data parallelism it sets every rank's pace), else the primary one (rank 0's, or the run's steps)."""
    ranks = {m.rank for m in ctx.metrics if m.rank is not None}
    if len(ranks) > 1:
        rank = slowest_rank
        if rank is None or rank not in ranks:  # without a rank summary: the most work per step
            led = [(ctx.ledger(m), m.rank) for m in ctx.metrics if m.ledger is not None]
            led = [(lg, r) for lg, r in led if lg is not None and lg.windows]
            if led:
                rank = max(led, key=lambda lr: (lr[0].step_ns * (1 - lr[0].pct(C.COMM_EXPOSED) / 100.0),
                                                -(lr[1] or 0)))[1]
        m = ctx.primary_trace(rank)
        if m is not None:
            return ctx.ledger(m)
    return ctx.ledger()


def project(ledger: Ledger, step_ns: int | None, findings: Sequence[Finding],
            multi: bool = False) -> tuple[tuple[Action, ...], tuple[Action, ...], float]:
    """(top actions, fixes ``--verify`` refuted, the share of ``ledger`` the findings claim).

    Pure: it reads the findings' granted claims and verifications only, so that a report whose
    findings were verified later (``gpudoctor verify``) is re-projected without the run
    (``with_verifications``)."""
    entries = []  # (finding, ledger key, granted %, expected %, measured %)
    tried = []
    for f in findings:
        placed = False
        meas = _measured_pct(f)
        for key in dict.fromkeys(c.ledger for c in f.gain.claims):
            if key != ledger.key and not multi:
                continue
            pct = sum(100.0 * c.granted_ns / c.total_ns for c in f.gain.claims if c.ledger == key and c.total_ns)
            if pct < _MIN_ACTION_PCT:
                continue
            placed = True
            exp = _expected_pct(f, pct)
            if _refuted(f):
                tried.append(Action(f.code, f.name, round(pct, 4), 0, f.rank, (),
                                    round(exp, 4) if exp is not None else None, None))
                continue
            entries.append((f, key, pct, exp, None if meas is None else min(meas, 100.0)))
        if placed or is_headline(f):
            continue
        # a fix --verify judged that holds no part of the account (GD503: the allocator's calls fall in
        # every part; a part granted to another finding): confirmed, it ranks at what it measured; refuted,
        # it was tried all the same
        if meas is not None:
            entries.append((f, ledger.key, 0.0, None, min(meas, 100.0)))
        elif _refuted(f):
            tried.append(Action(f.code, f.name, 0.0, 0, f.rank, (), None, None))

    def value(e) -> float:
        _, _, pct, exp, meas = e
        return meas if meas is not None else exp if exp is not None else pct

    entries.sort(key=lambda e: (-value(e), -e[2], e[0].code, -1 if e[0].rank is None else e[0].rank))
    # every fix --verify confirmed is an action, however many the expected ones ahead of it
    chosen = entries[:TOP_ACTIONS] + [e for e in entries[TOP_ACTIONS:] if e[4] is not None]
    actions = []
    left = left_expected = 100.0
    for f, key, pct, exp, meas in chosen:
        comps = tuple(c.component for c in f.gain.claims if c.granted_ns > 0 and c.ledger == key)
        shown = meas if meas is not None else exp
        if key == ledger.key:
            left -= pct
            left_expected -= shown if shown is not None else pct
            # a confirmed fix outside the account's parts has no bound of its own
            after = int(round(step_ns * max(left, 0.0) / 100.0)) if step_ns and comps else 0
            expected_after = int(round(step_ns * max(left_expected, 0.0) / 100.0)) if step_ns else None
        else:
            after, expected_after = 0, None  # another rank's step: no projection of the job's step
        actions.append(Action(f.code, f.name, round(pct, 4), after, f.rank, comps,
                              round(shown, 4) if shown is not None else None, expected_after,
                              round(meas, 4) if meas is not None else None))
    claimed = round(sum(e[2] for e in entries if e[1] == ledger.key), 4)
    return tuple(actions), tuple(tried), claimed


def with_verifications(account: Account | None, findings: Sequence[Finding]) -> Account | None:
    """The account re-projected once ``--verify`` judged the findings: a confirmed fix ranks by what
    it measured, a refuted one leaves the actions for ``tried``."""
    if account is None:
        return None
    actions, tried, claimed = project(account.ledger, account.step_ns, findings, account.ranks > 1)
    return replace(account, actions=actions, tried=tried, claimed_pct=claimed)


def build_account(ctx: RuleContext, findings: list[Finding], slowest_rank: int | None = None,
                  slowest_excess_ns: int | None = None) -> Account | None:
    """The account of the job (``account_ledger``), from the findings as granted (``assign_gains``
    first). Top actions come from every rank's findings, ranked by what each fix wins: measured by
    ``--verify`` when it was confirmed, else its rule's model, else its bound; a fix ``--verify``
    refuted leaves them for ``Account.tried``. The projection (the step after each action) runs along
    the account's ledger; another rank's action is a share of that rank's step."""
    ledger = account_ledger(ctx, slowest_rank)
    if ledger is None or ledger.total_ns <= 0:
        return None
    # the run's step time (analysis.figures: the mean over the unprofiled steady steps), else the trace's windows'
    step_ns, source, of_steps = ctx.figures.account_step(ledger, ctx.primary_trace(ledger.rank))
    ranks = len({mm.rank for mm in ctx.metrics if mm.rank is not None})
    multi = ranks > 1
    actions, tried, claimed = project(ledger, step_ns, findings, multi)
    notes = [
        "each action's expected gain is its rule's model (its documentation states it), or what --verify measured; "
        "the bound is its whole exclusive share of the step, after the ones before it: the step after a fix is at "
        "least the bound's figure (a fix shortens its part; it may not remove it)"
    ]
    if ledger.basis == LedgerBasis.GPU:
        notes.append("GPU idle time is won only by host-side fixes, kernel time only by faster kernels (docs/account.md)")
    if step_ns and of_steps and ledger.basis != LedgerBasis.STEPS:
        notes.append(f"shares of {ledger.window}, applied to the {source} ({fmt_ns(step_ns)})")
    notes.extend(settling_notes(ctx, ledger))
    weight = weight_note(ledger, ctx.thresholds.profiler_weight_max_ratio)
    if weight:
        notes.append(weight)
    if multi:
        notes.append(f"{ledger.label}'s account: the slowest rank sets every rank's pace in synchronous training; "
                     "an action on another rank is a share of that rank's step")
        if slowest_excess_ns:
            notes.append(f"on the other ranks, exposed communication includes ~{fmt_ns(slowest_excess_ns)} per step "
                         f"of waiting for {ledger.label}: that is its work, not communication to hide (GD603)")
    return Account(
        headline=headline(ledger),
        ledger=ledger,
        step_ns=step_ns,
        step_source=source,
        actions=actions,
        claimed_pct=claimed,
        notes=tuple(notes),
        tried=tried,
        ranks=max(ranks, 1),
    )


__all__ = ["OWNERS", "account_ledger", "assign_gains", "build_account", "project", "with_verifications", "headline", "is_headline", "label", "point_headline"]

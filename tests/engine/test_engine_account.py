"""The account (docs/account.md): exclusive gains, the owner order, GD101 as the headline, the
projection, on hand-built runs."""

from __future__ import annotations

import dataclasses

from rule_builders import (
    MS,
    GapCause,
    HostSync,
    NameStat,
    SyncSummary,
    cpu_manifest,
    cpu_trace,
    dataloader,
    manifest,
    run,
    settings,
    steps,
    trace,
    transfer,
    utilization,
)

from gpudoctor import engine
from gpudoctor.config import Config
from gpudoctor.model import Claim, Confidence, Finding, Fix, Gain, Severity
from gpudoctor.rules.account import OWNERS, assign_gains
from gpudoctor.rules.context import RuleContext


def _finding(code: str, *claims: tuple[str, int, int], share: float = 0.0) -> Finding:
    """A finding claiming (part, requested ns, part ns) of one 100 ms ledger."""
    cs = tuple(Claim(p, "L", req, req, part, 100 * MS) for p, req, part in claims)
    return Finding(code, code.lower(), Severity.INFO, Confidence.MEASURED, "m", Fix("f"),
                   gain=Gain(share, None, "", cs))


def test_a_part_is_granted_once_owner_first():
    ctx = RuleContext(run())
    sync = 30 * MS
    out = assign_gains(ctx, [_finding("GD302", ("sync_wait", 20 * MS, sync)), _finding("GD102", ("sync_wait", sync, sync))])
    blocking, host_sync = out
    assert OWNERS[next(c for c in OWNERS if c.value == "sync_wait")][0] == "GD102"
    assert host_sync.gain.share_pct == 30.0 and host_sync.severity == Severity.ERROR
    assert blocking.gain.share_pct == 0.0 and blocking.gain.included_in == ("GD102",)
    assert blocking.severity == Severity.INFO and "included in GD102" in blocking.gain.note


def test_a_partial_claimant_keeps_what_the_owner_left():
    ctx = RuleContext(run())
    other = 40 * MS
    out = assign_gains(ctx, [_finding("GD702", ("other_cpu", 10 * MS, other), ("d2h", 2 * MS, 2 * MS)),
                             _finding("GD502", ("other_cpu", 5 * MS, other))])
    loss, alloc = out
    assert loss.gain.share_pct == 12.0 and alloc.gain.share_pct == 5.0  # 10 + 5 of 40 ms: both fit
    # the loop's Python as a whole (GD203) comes after the measured causes inside it: they keep their own
    # time, it gets the rest of the part
    out = assign_gains(ctx, [_finding("GD203", ("other_cpu", other, other)), *out])
    python, loss, alloc = out
    assert loss.gain.share_pct == 12.0 and alloc.gain.share_pct == 5.0
    assert python.gain.share_pct == 25.0 and python.gain.included_in == ("GD502", "GD702")


def test_faster_kernels_are_granted_by_their_expected_win():
    """No fix removes kernel time: on a device-busy part the claimant that expects to win more owns it
    (GD403's measured autotuning gain over GD401's AMP model on the convolutions), OWNERS breaking ties."""
    ctx = RuleContext(run())
    conv = 40 * MS

    def claimant(code: str, frac: float | None) -> Finding:
        f = _finding(code, ("gpu_fp32_conv", conv, conv))
        return dataclasses.replace(f, gain=dataclasses.replace(f.gain, expected_fraction=frac))

    amp, bench = assign_gains(ctx, [claimant("GD401", 0.5), claimant("GD403", 0.7)])
    assert bench.gain.share_pct == 40.0 and amp.gain.share_pct == 0.0 and amp.gain.included_in == ("GD403",)
    amp, bench = assign_gains(ctx, [claimant("GD401", 0.5), claimant("GD403", 0.1)])
    assert amp.gain.share_pct == 40.0 and bench.gain.included_in == ("GD401",)
    amp, bench = assign_gains(ctx, [claimant("GD401", 0.5), claimant("GD403", 0.5)])
    assert amp.gain.share_pct == 40.0  # a tie: OWNERS (GD401 first)
    amp, bench = assign_gains(ctx, [claimant("GD401", None), claimant("GD403", 0.05)])
    assert bench.gain.share_pct == 40.0  # a model before none


def _gpu_run():
    m = trace(
        utilization=(utilization(60.0, causes={GapCause.DATALOADER: 0.5, GapCause.SYNC: 0.5}),),
        syncs=SyncSummary(count=50, total_ns=20 * MS, share_of_steps_pct=40.0,
                          by_name=(NameStat("aten::item", 50, 20 * MS),),
                          top=(HostSync("cudaStreamSynchronize", 0, MS),)),
        transfers=(transfer("DtoH", "pageable", count=50, nbytes=50, dur_ns=2 * MS, blocking_count=50,
                            blocking_dur_ns=15 * MS, steps_with=5),),
    )
    return run(manifest=manifest(), settings=settings(), metrics=(m,))


def test_the_findings_of_a_run_claim_at_most_its_step_and_gd101_heads_the_causes():
    rep = engine.diagnose(_gpu_run(), Config(), "analyze")
    by = {f.code: f for f in rep.findings}
    assert {"GD101", "GD201", "GD102", "GD302"} <= set(by)
    assert sum(f.gain.share_pct or 0.0 for f in rep.findings) <= 100.0
    assert by["GD201"].gain.share_pct == 30.0 and by["GD102"].gain.share_pct == 30.0
    assert by["GD302"].gain.share_pct == 0.0 and by["GD302"].gain.included_in == ("GD102",)
    assert [f.code for f in rep.findings][-1] == "GD101"
    head = by["GD101"]
    assert head.gain.share_pct is None and head.severity == Severity.ERROR
    assert "the causes are findings GD102 (30.0% of step time), GD201 (30.0% of step time)" in head.message
    assert head.fix.instruction == "Fix its causes, largest first: GD102, GD201."
    a = rep.account
    assert a is not None and a.ledger.basis == "gpu"
    assert a.headline.startswith("GPU idle 60.0% of step time: waiting for the DataLoader 30.0%, host synchronizations 30.0%")
    # the device→host copies while the GPU did nothing else are GD303's own part
    assert [(x.code, x.gain_pct) for x in a.actions] == [("GD102", 30.0), ("GD201", 30.0), ("GD303", 4.0)]
    assert a.step_ns == 10 * MS and "mean of" in a.step_source  # no steps.jsonl: the windows' mean
    assert [x.step_ns_after for x in a.actions] == [7 * MS, 4 * MS, 3_600_000]
    assert a.claimed_pct == 64.0


def test_a_gpu_run_with_steps_claims_the_gpu_idle_data_wait_not_the_host_wait():
    """The loop waits 40% of every step for data (steps.jsonl), but the GPU sat idle for it only 10% of
    the profiled steps (it ran queued work meanwhile): what workers can win is the 10%."""
    m = trace(utilization=(utilization(20.0, causes={GapCause.DATALOADER: 0.5, GapCause.OTHER: 0.5}),))
    data = run(manifest=manifest(), settings=settings(), metrics=(m,), steps=steps(20, 100.0, 40.0))
    rep = engine.diagnose(data, Config(), "profile")
    (f,) = [x for x in rep.findings if x.code == "GD201"]
    assert "waits 40.0% of step time" in f.message and "idle waiting for it 10.0%" in f.message
    assert f.gain.share_pct == 10.0 and f.severity == Severity.WARNING
    a = rep.account
    # the run's step time: the mean over the steady steps (every step 100 ms)
    assert a.step_ns == 100 * MS and a.step_source == "mean of 19 steady steps"
    assert a.actions[0].step_ns_after == 90 * MS


def test_a_cpu_run_with_steps_takes_the_wait_from_every_step():
    m = cpu_trace(breakdown_mean_pct={"data_loading": 5.0, "cpu_compute": 70.0, "other_cpu": 25.0})
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu", dataloaders=(dataloader(),)),
               metrics=(m,), steps=steps(20, 100.0, 60.0))
    rep = engine.diagnose(data, Config(), "profile")
    (f,) = [x for x in rep.findings if x.code == "GD201"]
    assert f.gain.share_pct == 60.0
    a = rep.account
    assert a.ledger.basis == "steps" and a.headline.startswith("host-bound (no GPU activity): waiting for the DataLoader 60.0%")
    assert a.ledger.window == "19 steady steps (steps.jsonl; the rest split as the trace splits it)"
    parts = {s.component: s.pct for s in a.ledger.slices}
    assert parts["data_loading"] == 60.0 and round(parts["cpu_compute"], 1) == round(40 * 70 / 95, 1)


def test_without_a_trace_the_account_is_the_steps():
    data = run(manifest=cpu_manifest(), settings=settings(device_type="cpu"), steps=steps(20, 100.0, 30.0))
    rep = engine.diagnose(data, Config(), "profile")
    a = rep.account
    assert a is not None and {s.component for s in a.ledger.slices} == {"data_loading", "unexplained"}
    assert [x.code for x in a.actions] == ["GD201"] and a.actions[0].step_ns_after == 70 * MS


def test_no_measurement_no_account():
    rep = engine.diagnose(dataclasses.replace(run(), metrics=()), Config(), "analyze")
    assert rep.account is None


def test_the_traces_of_one_process_are_one_ledger():
    """A repeating profiler schedule writes one trace per cycle: the claims and the account are of
    the process's traces together, so they meet and no step is granted twice."""
    a = trace(path="p.00000011.pt.trace.json.gz", utilization=(utilization(40.0, causes={GapCause.DATALOADER: 1.0}),))
    b = trace(path="p.00000311.pt.trace.json.gz", utilization=(utilization(20.0, causes={GapCause.DATALOADER: 1.0}),))
    rep = engine.diagnose(run(manifest=manifest(), settings=settings(), metrics=(a, b)), Config(), "analyze")
    (f,) = [x for x in rep.findings if x.code == "GD201"]
    (claim,) = f.gain.claims
    assert claim.ledger.startswith("traces(2):") and f.gain.share_pct == 30.0  # (20 + 10) ms of 100 ms
    assert rep.account.ledger.key == claim.ledger and rep.account.actions[0].code == "GD201"
    assert rep.account.ledger.window == "10 windows of 2 traces"
    (idle,) = [x for x in rep.findings if x.code == "GD101"]
    assert idle.message.startswith("GPU 0 idle 30.0% of 10 windows of 2 traces")


# --------------------------------------------------------------------------- expected gains, --verify, ranks

from gpudoctor.model import Account, Ledger, LedgerSlice, Verification, VerifyStatus  # noqa: E402
from gpudoctor.report._fmt import action_text, tried_text  # noqa: E402
from gpudoctor.rules.account import project, with_verifications  # noqa: E402


def _ledger(key: str = "L", rank: int | None = None) -> Ledger:
    parts = {"data_loading": 34, "gpu_fp32_conv": 37, "gpu_compute": 29}
    return Ledger(key, "gpu", key, "1 window", 1, 100 * MS,
                  tuple(LedgerSlice(c, v * MS, float(v), "host" if c == "data_loading" else "device")
                        for c, v in parts.items()), rank=rank)


def _claiming(code: str, part: str, pct: int, fraction: float | None, key: str = "L", rank: int | None = None,
              verification: Verification | None = None) -> Finding:
    ctx = RuleContext(run())
    g = ctx.gain(float(pct), "", fraction, "model" if fraction is not None else "")
    claim = Claim(part, key, pct * MS, pct * MS, pct * MS, 100 * MS)
    return Finding(code, code.lower(), Severity.ERROR, Confidence.MEASURED, "m", Fix("f"),
                   gain=dataclasses.replace(g, claims=(claim,)), rank=rank, verification=verification)


def test_actions_rank_by_the_expected_gain_and_show_both_with_the_right_inequality():
    """The V100 ResNet-50 case: AMP's bound (37%) is larger than the DataLoader's (34%), but Tensor Cores
    win ~2/3 of the FP32 kernels while workers hide nearly all of the wait."""
    amp = _claiming("GD401", "gpu_fp32_conv", 37, 2 / 3)
    dl = _claiming("GD201", "data_loading", 34, 0.95)
    actions, tried, claimed = project(_ledger(), 100 * MS, [amp, dl])
    assert [a.code for a in actions] == ["GD201", "GD401"] and not tried and claimed == 71.0
    first, second = actions
    assert first.expected_pct == 32.3 and first.step_ns_expected == 67_700_000 and first.step_ns_after == 66 * MS
    assert abs(second.expected_pct - 24.667) < 0.01 and second.step_ns_after == 29 * MS
    text = action_text(second)
    assert "−24.7% expected (up to −37.0%)" in text and "→ about 43.0 ms (≥ 29.0 ms) per step" in text
    assert all(a.expected_pct <= a.gain_pct for a in actions)  # the expected share never passes the bound


def _verified(status: VerifyStatus, speedup: float | None) -> Verification:
    return Verification(status, "r", speedup=speedup)


def test_a_refuted_fix_leaves_the_actions_and_a_confirmed_one_ranks_by_what_it_measured():
    dl = _claiming("GD201", "data_loading", 34, 0.95, verification=_verified(VerifyStatus.REFUTED, 0.98))
    amp = _claiming("GD401", "gpu_fp32_conv", 37, 2 / 3)
    bench = _claiming("GD403", "gpu_compute", 29, 0.1, verification=_verified(VerifyStatus.CONFIRMED, 1.5))
    account = Account("h", _ledger(), 100 * MS, "mean", ())
    account = with_verifications(account, [dl, amp, bench])
    assert [a.code for a in account.actions] == ["GD403", "GD401"]  # measured 33.3% > AMP's expected 24.7%
    # 1 - 1/1.5 = 33.3%: a measurement, shown as measured even where it passes the rule's bound (29%)
    assert account.actions[0].measured_pct == 33.3333 and account.actions[0].gain_pct == 29.0
    assert "measured by --verify" in action_text(account.actions[0])
    assert [a.code for a in account.tried] == ["GD201"]


def test_a_job_of_several_ranks_leads_with_the_slowest_ranks_ledger_and_ranks_every_ranks_actions():
    slow, fast = _ledger("R7", rank=7), _ledger("R0", rank=0)
    launch = _claiming("GD103", "data_loading", 33, 0.5, key="R7", rank=7)
    sync = _claiming("GD102", "data_loading", 6, 0.9, key="R0", rank=0)
    actions, _, claimed = project(slow, 100 * MS, [sync, launch], multi=True)
    assert [(a.code, a.rank) for a in actions] == [("GD103", 7), ("GD102", 0)]
    assert actions[0].step_ns_after == 67 * MS and actions[1].step_ns_after == 0  # only the slow rank's step
    assert claimed == 33.0
    single, _, _ = project(fast, 100 * MS, [sync, launch], multi=False)
    assert [a.code for a in single] == ["GD102"]


def test_verify_re_projects_the_account_once_it_judged_the_fixes():
    """gpudoctor verify attaches the verdicts and re-projects the account: the refuted fix leaves the
    top actions, the confirmed one leads with what it measured, and the findings are re-ranked."""
    from gpudoctor.model import Report
    from gpudoctor.verify import _attach

    dl = _claiming("GD201", "data_loading", 34, 0.95)
    amp = _claiming("GD401", "gpu_fp32_conv", 37, 2 / 3)
    actions, tried, claimed = project(_ledger(), 100 * MS, [dl, amp])
    rep = Report(4, "0", "profile", "run", "now", findings=(dl, amp),
                 account=Account("h", _ledger(), 100 * MS, "mean", actions, claimed))
    assert [a.code for a in rep.account.actions] == ["GD201", "GD401"]
    out = _attach(rep, {0: _verified(VerifyStatus.REFUTED, 0.99), 1: _verified(VerifyStatus.CONFIRMED, 1.25)})
    assert [a.code for a in out.account.actions] == ["GD401"] and out.account.actions[0].measured_pct == 20.0
    assert [a.code for a in out.account.tried] == ["GD201"]
    assert [f.code for f in out.findings] == ["GD401", "GD201"]


def _unclaimed(code: str, verification: Verification | None) -> Finding:
    """A finding that claims no part of the ledger (GD503: the allocator's calls fall in every part)."""
    ctx = RuleContext(run())
    return Finding(code, code.lower(), Severity.WARNING, Confidence.MEASURED, "m", Fix("f"),
                   gain=ctx.gain(None, "", None, ""), verification=verification)


def test_after_verify_every_confirmed_fix_is_a_top_action_at_its_measured_gain():
    """The issue's mnist case: GD503 confirmed 1.20× faster, GD201 not confirmed (inconclusive); before,
    Top actions listed GD201 alone, since GD503 holds no part of the account."""
    from gpudoctor.model import Report
    from gpudoctor.verify import _attach

    dl = _claiming("GD201", "data_loading", 34, 0.95)
    alloc = _unclaimed("GD503", None)
    actions, tried, claimed = project(_ledger(), 100 * MS, [dl, alloc])
    assert [a.code for a in actions] == ["GD201"]  # not verified yet: GD503 has no share to rank by
    rep = Report(4, "0", "profile", "run", "now", findings=(dl, alloc),
                 account=Account("h", _ledger(), 100 * MS, "mean", actions, claimed))
    out = _attach(rep, {0: _verified(VerifyStatus.INCONCLUSIVE, 1.01), 1: _verified(VerifyStatus.CONFIRMED, 1.2)})
    confirmed = [f.code for f in out.findings if f.verification.status == VerifyStatus.CONFIRMED]
    by_code = {a.code: a for a in out.account.actions}
    assert confirmed == ["GD503"] and set(by_code) == {"GD201", "GD503"}
    got = by_code["GD503"]
    assert got.measured_pct == got.expected_pct == 16.6667  # 1 - 1/1.20, as measured
    assert got.gain_pct == 0.0 and got.components == () and got.step_ns_after == 0  # no bound of its own
    assert [a.code for a in out.account.actions] == ["GD201", "GD503"]  # 32.3% expected, then 16.7% measured
    text = action_text(got)
    assert "GD503 gd503: −16.7% measured by --verify (outside the account's parts) of step time" in text
    assert "→ about" in text and "≥" not in text
    assert not out.account.tried


def test_a_confirmed_fix_is_an_action_however_many_expected_ones_rank_ahead():
    parts = ["data_loading", "gpu_fp32_conv", "gpu_compute"]
    big = [_claiming(f"GD{300 + i}", parts[i % 3], 10, 0.9) for i in range(7)]
    small = _claiming("GD499", "gpu_compute", 5, 0.5, verification=_verified(VerifyStatus.CONFIRMED, 1.02))
    actions, _, _ = project(_ledger(), 100 * MS, [*big, small])
    codes = [a.code for a in actions]
    assert len(codes) == 6 and codes[-1] == "GD499"  # the top five expected ones, then the confirmed one
    assert actions[-1].measured_pct == 1.9608


def test_a_refuted_fix_outside_the_account_is_tried_too():
    alloc = _unclaimed("GD503", _verified(VerifyStatus.REFUTED, 0.97))
    actions, tried, _ = project(_ledger(), 100 * MS, [alloc])
    assert not actions and [a.code for a in tried] == ["GD503"]
    assert tried_text(tried[0]) == "GD503 gd503: tried by --verify, did not help"

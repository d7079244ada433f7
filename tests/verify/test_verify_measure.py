"""``verify.measure`` and ``verify_report`` with the trial runs stood in for: the rounds, the second
look, the ladder, the budget, and nothing to try.

``verify.trials._trial`` is replaced by a function that makes the runs a script would give for the
change it is asked for (step times from a table, each run with its own level drawn from a seeded
generator), so that the orchestration is tested without starting processes; the real runs are
``test_verify_e2e.py``'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from rule_builders import SITE, cpu_manifest, dataloader, run, settings, steps

from gpudoctor import verify
from gpudoctor.config import Config
from gpudoctor.model import (
    AppliedInjection,
    Confidence,
    Finding,
    Fix,
    Injection,
    LadderRung,
    Report,
    Severity,
    StepRecord,
    Verification,
    VerifyStatus,
)
from gpudoctor.verify import VerifyOptions, _Arm, _Run, measure, verify_report, with_verification

MS = 1_000_000
# the runs here are built in memory (no manifest on disk to trust: test_verify_trust.py): run them as --yes does
OPTS = VerifyOptions(steps=30, warmup_steps=5, trials=3, budget_s=600.0, yes=True)


def _workers(n: int) -> Injection:
    return Injection("dataloader", "num_workers", n, SITE, text=f"DataLoader num_workers={n} at {SITE}")


def _data(tmp_path: Path, cores: int = 2):
    """The profiled run: its DataLoader at train.py:31 with no workers and batches of 64."""
    (tmp_path / "train.py").write_text("pass\n")
    mf = cpu_manifest(cwd=str(tmp_path), script=str(tmp_path / "train.py"), cpu_count=cores,
                      script_sha256=hashlib.sha256(b"pass\n").hexdigest())
    s = settings(device_type="cpu", dataloaders=(dataloader(batch_size=64, num_workers=0),))
    return run(source=str(tmp_path / "run"), manifest=mf, settings=s, steps=steps(20, 25.0))


def _fake(step_ms: Callable[[tuple[Injection, ...]], float | None], run_sd: float = 0.01, seed: int = 0):
    """A stand-in for ``verify.trials._trial``: 30 steps of ``step_ms(changes)`` ms at a level of the run's own
    (lognormal, ``run_sd``); None: the run fails, out of memory."""
    rng = np.random.default_rng(seed)
    calls: list[tuple[str, tuple[Injection, ...]]] = []

    def trial(manifest, run_dir, rel, changes, opts, timeout_s, rnd=0):
        calls.append((rel, changes))
        ms = step_ms(changes)
        s = settings(device_type="cpu", dataloaders=(dataloader(batch_size=_value(changes, "batch_size") or 64),),
                     injected=tuple(AppliedInjection(c, 1) for c in changes))
        if ms is None:
            return _Run(rel, False, [], s, 0.01, error=f"{rel}: failed: OutOfMemoryError: CUDA out of memory",
                        status="failed", round=rnd)
        level = ms * float(np.exp(rng.normal(0.0, run_sd)))
        walls = level * (1 + rng.uniform(-0.02, 0.02, opts.steps))
        recs, t = [], 0
        for i, w in enumerate(walls):
            recs.append(StepRecord(index=i, start_ns=t, wall_ns=int(w * MS)))
            t += int(w * MS)
        return _Run(rel, True, recs, s, 0.01, status="stopped", round=rnd)

    return trial, calls


def _value(changes: tuple[Injection, ...], key: str = "num_workers") -> int | None:
    return next((c.value for c in changes if c.key == key), None)


def test_a_clear_fix_is_decided_at_the_first_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    arm = _Arm("GD201", (_workers(1),))
    out, session = measure(_data(tmp_path), [arm], Config(), OPTS)
    v = out["GD201"]
    assert v.status == VerifyStatus.CONFIRMED and v.looks == 1 and v.max_looks == 2
    assert v.look_confidence_pct == 97.5 and v.confidence_pct == 95.0
    assert len(calls) == 6 and session.rounds == 3  # 3 rounds of a baseline and a fix run, no more
    assert [rel.split("/")[1] for rel, _ in calls] == ["baseline", "GD201", "GD201", "baseline", "baseline", "GD201"]
    assert {r.round for r in v.per_run} == {1, 2, 3} and len(v.per_run) == 6


def test_an_undecided_fix_gets_more_rounds_and_a_second_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 1.12× with runs that differ by 5%: the first look straddles 1.05×
    trial, calls = _fake(lambda ch: 25.0 if ch else 28.0, run_sd=0.05, seed=3)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    lines: list[str] = []
    opts = dataclasses.replace(OPTS, progress=lines.append, ladder=False)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), opts)
    v = out["GD201"]
    assert v.looks == 2 and v.trials == 6 and v.baseline_runs == 6 and session.rounds == 6
    assert any("undecided after 3 round(s): more rounds, up to 6" in x for x in lines)
    assert "look 2 of 2 at 97.5%" in v.reason


def test_max_trials_equal_to_trials_means_one_look(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, calls = _fake(lambda ch: 25.0 if ch else 28.0, run_sd=0.05, seed=3)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    opts = dataclasses.replace(OPTS, max_trials=3, ladder=False)
    v = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), opts)[0]["GD201"]
    assert v.max_looks == 1 and v.look_confidence_pct == 95.0 and len(calls) == 6


def _loader(ch: tuple[Injection, ...]) -> float:
    """A loader waiting on storage: 40 ms a step without workers; one worker no better, then
    load ÷ workers until the 10 ms of compute."""
    w = _value(ch)
    return {None: 40.0, 1: 40.0, 2: 20.0, 4: 10.5, 8: 10.5}[w]


def test_the_ladder_climbs_to_the_best_measured_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, calls = _fake(_loader)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    arm = _Arm("GD201", (_workers(1), Injection("dataloader", "persistent_workers", True, SITE)))
    v = measure(_data(tmp_path, cores=2), [arm], Config(), OPTS)[0]["GD201"]
    assert v.status == VerifyStatus.CONFIRMED and v.measured_best == "num_workers=4", v.reason
    assert [(r.value, r.status) for r in v.ladder][:3] == [
        (1, VerifyStatus.REFUTED), (2, VerifyStatus.CONFIRMED), (4, VerifyStatus.CONFIRMED)]
    # 8 no better than 4 by the minimum effect (1.05×): the climb stops there, and 4 is the best
    assert [r.value for r in v.ladder] == [1, 2, 4, 8]
    assert v.ladder[1].confidence_pct == pytest.approx(100 - 5 / 3)  # three rungs planned: 2, 4, 8
    assert _value(v.changes) == 4 and ("persistent_workers" in {c.key for c in v.changes})
    assert v.speedup == pytest.approx(40 / 10.5, rel=0.05)
    assert v.reason.startswith("measured best: num_workers=4") and "num_workers=1 first was refuted" in v.reason
    assert any("num_workers=4 at train.py:31" in (c.text or "") for _, ch in calls for c in ch)


def test_the_ladder_stops_at_the_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, _ = _fake(lambda ch: 40.0)  # nothing helps
    monkeypatch.setattr(verify.trials, "_trial", trial)
    v = measure(_data(tmp_path, cores=1), [_Arm("GD201", (_workers(1),))], Config(), OPTS)[0]["GD201"]
    assert v.status != VerifyStatus.CONFIRMED and not v.measured_best
    assert [r.value for r in v.ladder] == [1, 2]  # 4 workers per core on 1 core; 2 no better: stop
    assert "the ladder confirmed no setting" in v.reason


def test_a_fix_that_lowers_a_knob_is_not_climbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, calls = _fake(lambda ch: 40.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _data(tmp_path)
    data = dataclasses.replace(data, settings=settings(device_type="cpu", dataloaders=(dataloader(num_workers=6),)))
    v = measure(data, [_Arm("GD204", (_workers(2),))], Config(), OPTS)[0]["GD204"]  # GD204: 6 workers -> 2
    assert not v.ladder and len(calls) <= 12


def test_a_batch_size_ladder_stops_at_the_first_failing_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def per_batch(ch: tuple[Injection, ...]) -> float | None:
        b = _value(ch, "batch_size")
        # batches of 64 (the script's own) in 30 ms; 128 no faster per sample; 256 1.5× per sample; 512 out of memory
        return {None: 30.0, 128: 60.0, 256: 80.0, 512: None}[b]

    trial, calls = _fake(per_batch)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    arm = _Arm("GD104", (Injection("dataloader", "batch_size", 128, SITE, text=f"batch_size=128 at {SITE}"),))
    v = measure(_data(tmp_path), [arm], Config(), OPTS)[0]["GD104"]
    assert [r.value for r in v.ladder] == [128, 256, 512]
    assert v.ladder[-1].status == VerifyStatus.INCONCLUSIVE and "out of memory" in v.ladder[-1].reason
    assert v.measured_best == "batch_size=256" and v.per_sample
    assert v.speedup == pytest.approx(1.5, rel=0.05)


def test_the_budget_stops_the_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    monkeypatch.setattr(verify.trials, "_estimate_s", lambda run, steps: 1000.0)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert out == {} and session.out_of_budget and not calls


def test_the_fix_names_the_measured_value() -> None:
    f = Finding("GD201", "dataloader-stall", Severity.ERROR, Confidence.MEASURED, "m",
                Fix("Set num_workers=1, persistent_workers=True on the DataLoader at train.py:31.",
                    "DataLoader(ds)", "DataLoader(ds, num_workers=1, persistent_workers=True)"))
    v = Verification(VerifyStatus.CONFIRMED, "r", speedup=3.8, ci=(3.5, 4.1), measured_best="num_workers=4",
                     ladder=(LadderRung("num_workers", 1, VerifyStatus.REFUTED, 1.0),
                             LadderRung("num_workers", 4, VerifyStatus.CONFIRMED, 3.8, (3.5, 4.1))))
    g = with_verification(f, v)
    assert g.fix.instruction.startswith("Set num_workers=4, persistent_workers=True")
    assert "Measured by --verify: num_workers=4 is the best setting tried, 3.80× faster (95% CI 3.50×–4.10×)" in g.fix.instruction
    assert "num_workers=1 gave 1.00× (refuted)" in g.fix.instruction
    assert "num_workers=4" in g.fix.after and "num_workers=1" not in g.fix.after
    assert with_verification(g, v).fix == g.fix  # said once
    plain = with_verification(f, dataclasses.replace(v, measured_best="", ladder=()))
    assert plain.fix == f.fix and plain.verification is not None


def test_nothing_to_try_is_said_in_one_line_and_in_the_report(tmp_path: Path) -> None:
    data = _data(tmp_path)
    rep = Report(schema_version=1, gpudoctor_version="0", kind="profile", source=data.source, created_at="", run=data,
                 findings=(Finding("GD104", "batch-too-small", Severity.WARNING, Confidence.MEASURED, "m", Fix("f")),
                           Finding("GD203", "main-process-cpu-bound", Severity.WARNING, Confidence.MEASURED, "m",
                                   Fix("f"))))
    lines: list[str] = []
    out = verify_report(rep, Config(), dataclasses.replace(OPTS, progress=lines.append))
    assert out.runs == 0 and len(lines) == 1
    assert lines[0].startswith("gpudoctor: verify: nothing to try: no finding has a fix gpudoctor can apply")
    assert "GD104: a larger batch changes the optimization" in lines[0] and "GD203:" in lines[0]
    (stat,) = [s for s in out.report.summary if s.key == "verified"]
    assert stat.value == lines[0].removeprefix("gpudoctor: verify: ")
    empty = dataclasses.replace(rep, findings=())
    assert [s.value for s in verify_report(empty, Config(), OPTS).report.summary if s.key == "verified"] == [
        "nothing to try: no findings"]


def _timed(monkeypatch: pytest.MonkeyPatch, durations_s: dict[bool, float]):
    """``_fake``'s runs, each taking ``durations_s[with a fix]`` seconds of a clock the session reads."""
    import time

    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    start, passed = time.monotonic(), [0.0]
    monkeypatch.setattr(verify.trials.time, "monotonic", lambda: start + passed[0])

    def timed(manifest, run_dir, rel, changes, opts, timeout_s, rnd=0):
        r = trial(manifest, run_dir, rel, changes, opts, timeout_s, rnd)
        passed[0] += durations_s[bool(changes)]
        return dataclasses.replace(r, duration_s=durations_s[bool(changes)])

    monkeypatch.setattr(verify.trials, "_trial", timed)
    return calls


def test_the_budget_is_used_for_the_rounds_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--verify-trials 2 with a 120 s budget: a 33 s baseline and a 24 s fix run make a 57 s round, and two
    fit. Each run was taken to last as long as the longest so far (33 s): the second round's fix run was
    judged not to fit after its baseline run, and the verdict advised "give --verify-trials 2 or more"."""
    calls = _timed(monkeypatch, {False: 33.0, True: 24.0})
    lines: list[str] = []
    opts = dataclasses.replace(OPTS, trials=2, budget_s=120.0, progress=lines.append, ladder=False)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), opts)
    v = out["GD201"]
    assert session.rounds == 2 and len(calls) == 4 and (v.trials, v.baseline_runs) == (2, 2)
    assert "one run a side" not in v.reason and "--verify-trials" not in v.reason


def test_a_round_the_budget_cannot_hold_is_not_started_and_the_verdict_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _timed(monkeypatch, {False: 33.0, True: 24.0})
    lines: list[str] = []
    opts = dataclasses.replace(OPTS, trials=2, budget_s=100.0, progress=lines.append, ladder=False)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), opts)
    v = out["GD201"]
    assert session.rounds == 1 and len(calls) == 2  # no baseline run alone in a round that cannot finish
    assert "one run a side" in v.reason and "--verify-trials" not in v.reason
    why = ("the --verify-budget of 100 s held 1 round of the 2 asked (round 2 needed about 57 s, 43 s were left): "
           "give --verify-budget 120 or more")
    assert why in v.reason
    assert any(why in line for line in lines)


def test_the_budget_note_after_the_rounds_asked_asks_for_nothing(tmp_path: Path) -> None:
    """A budget spent on the rounds an undecided fix gets beyond those asked said "held 5 rounds of the 3
    asked": it says the rounds asked ran."""
    from gpudoctor.verify.trials import _Session

    data = _data(tmp_path)
    session = _Session(data.manifest, tmp_path, tmp_path, dataclasses.replace(OPTS, budget_s=300.0), 1.0)
    session.short = (6, 62.0, 35.0)
    note = session.budget_note()
    assert note == ("the --verify-budget of 300 s held 5 rounds (3 asked, the rest for what stayed undecided); the next "
                    "needed about 62 s, 35 s were left")
    session.short = (2, 57.0, 43.0)
    assert session.budget_note().startswith("the --verify-budget of 300 s held 1 round of the 3 asked")

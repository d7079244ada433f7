"""The entry points (``verify_report``, ``verify_run``) and what a verify leaves on the report:
each finding's verification, carried over to later analyses of the same run."""

from __future__ import annotations

import dataclasses
import re
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model import (
    Finding,
    Report,
    SummaryStat,
    Verification,
    VerifyStatus,
    layout,
)
from gpudoctor.verify.judging import _x
from gpudoctor.verify.plan import VerifyOptions, VerifyResult, _say, plan
from gpudoctor.verify.trials import measure


def verify_report(report: Report, config: Config | None = None, opts: VerifyOptions | None = None) -> VerifyResult:
    """Run the trials for ``report``'s findings (its ``run`` must be a run directory of
    ``gpudoctor profile``) and return the report with every finding's ``verification``."""
    opts = opts or VerifyOptions()
    opts.check()
    config = config or Config()
    arms, not_tried = plan(report, config)
    verifications: dict[int, Verification] = {
        i: Verification(VerifyStatus.NOT_TRIED, why) for i, why in not_tried.items()
    }
    if not arms:
        nothing = nothing_to_try(report, not_tried)
        _say(opts, f"gpudoctor: verify: {nothing}")
        return VerifyResult(_attach(report, verifications, nothing), False, 0.0, 0)
    assert report.run is not None
    t0 = time.monotonic()
    judged, session = measure(report.run, arms, config, opts)
    interrupted = session is not None and session.interrupted
    for arm in arms:
        v = judged.get(arm.label)
        if v is None:
            note = session.budget_note() if session is not None else ""
            why = (
                "interrupted (Ctrl-C) before its trial runs" if interrupted
                else f"the --verify-budget of {opts.budget_s:g} s ran out before its trial runs"
                + (f" ({note.split(': ', 1)[-1]})" if note else "")
            )
            v = Verification(VerifyStatus.NOT_TRIED, why, changes=arm.changes, steps=opts.steps)
        for i in arm.findings:
            verifications[i] = v
    started = session.started if session is not None else 0
    signum = (session.signum or int(signal.SIGINT)) if interrupted and session is not None else None
    return VerifyResult(_attach(report, verifications), interrupted, time.monotonic() - t0, started, signum)


def nothing_to_try(report: Report, not_tried: dict[int, str]) -> str:
    """One line: verify had nothing to try, and why (each finding's code with its reason)."""
    if not report.findings:
        return "nothing to try: no findings"
    reasons: dict[str, list[str]] = {}
    for i, why in sorted(not_tried.items()):
        reasons.setdefault(why, []).append(report.findings[i].code)
    parts = [f"{', '.join(dict.fromkeys(codes))}: {why}" for why, codes in reasons.items()]
    return "nothing to try: no finding has a fix gpudoctor can apply without editing the script (" + "; ".join(parts) + ")"


def verify_run(
    run_dir: Path | str, config: Config | None = None, opts: VerifyOptions | None = None, report: Report | None = None
) -> VerifyResult:
    """Diagnose ``run_dir`` (a run directory of ``gpudoctor profile``; ``report`` when already
    diagnosed) and verify its findings: the entry point for scripts such as the accuracy benchmark."""
    from gpudoctor.analysis import analyze_trace  # noqa: PLC0415
    from gpudoctor.engine import diagnose  # noqa: PLC0415
    from gpudoctor.parse import load_inputs  # noqa: PLC0415

    config = config or Config()
    if report is None:
        path = Path(run_dir)
        if not (path / layout.MANIFEST).is_file():
            raise UsageError(f"{path}: not a run directory of `gpudoctor profile` (no manifest.json); verify needs one")
        loaded = load_inputs([path])
        metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
        report = diagnose(dataclasses.replace(loaded.run, metrics=metrics), config, kind="analyze")
    return verify_report(report, config, opts)



def carry_over(report: Report, previous: Report | None, notes: Sequence[str] = ()) -> Report:
    """``report`` with the verifications of an earlier report of the same run (``report.json``) on the
    findings they still fit (same code, rank and location): ``analyze`` and ``report`` diagnose a run
    again without losing what ``verify`` measured. ``notes`` (``read_previous``'s: verifications it
    could not carry over, and why) join the run's notes, which every format shows."""
    if notes and report.run is not None:
        run = dataclasses.replace(report.run, notes=(*report.run.notes, *notes))
        report = dataclasses.replace(report, run=run)
    if previous is None:
        return report

    def key(f: Finding) -> tuple[str, int | None, str]:
        return f.code, f.rank, str(f.location) if f.location is not None else ""

    earlier = {key(f): f.verification for f in previous.findings if f.verification is not None}
    found = {i: earlier[key(f)] for i, f in enumerate(report.findings) if key(f) in earlier}
    return _attach(report, found) if found else report


def read_previous(run_dir: Path, notes: list[str] | None = None) -> Report | None:
    """The run's ``report.json`` when it holds verifications (None when absent, unreadable or malformed:
    a field of the wrong type or out of range, which ``analyze`` then writes over). A malformed one
    that holds verifications is not dropped silently: why goes into ``notes``."""
    import json  # noqa: PLC0415

    from gpudoctor.model._serde import check  # noqa: PLC0415

    data: object = None
    try:
        data = json.loads((Path(run_dir) / layout.REPORT).read_text(encoding="utf-8"))
        # untrusted like every file of a run: each field of its type, no integer past 64 bits, and a
        # verification's figures finite (they are shown and ranked); otherwise nothing is carried over
        check(Report, data)
        for i, f in enumerate(data["findings"]):
            if f.get("verification") is not None:
                check(Verification, f["verification"], f"findings[{i}].verification", finite=True)
        previous = Report.from_dict(data)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as err:  # FieldTypeError is a ValueError
        if notes is not None and _holds_verifications(data):
            why = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            notes.append(f"{layout.REPORT} is malformed ({why[:200]}): the verifications it holds are not shown; "
                         "`gpudoctor verify` measures them again")
        return None
    return previous if any(f.verification is not None for f in previous.findings) else None


def _holds_verifications(data: object) -> bool:
    """``data`` (a ``report.json`` as read) has a finding with a verification."""
    findings = data.get("findings") if isinstance(data, dict) else None
    return isinstance(findings, list) and any(
        isinstance(f, dict) and f.get("verification") is not None for f in findings
    )


def _attach(report: Report, verifications: dict[int, Verification], nothing: str = "") -> Report:
    """The findings with their verification (a fix the ladder measured names the best setting), and
    a headline of the outcomes; ``nothing``: why verify had nothing to try, said instead."""
    findings = tuple(
        with_verification(f, verifications.get(i, f.verification)) for i, f in enumerate(report.findings)
    )
    counts = {s: sum(1 for f in findings if f.verification is not None and f.verification.status == s) for s in VerifyStatus}
    text = nothing or ", ".join(f"{n} {s.value.replace('_', ' ')}" for s, n in counts.items())
    summary = tuple(s for s in report.summary if s.key != "verified") + (
        SummaryStat("verified", "verified fixes", text),
    )
    from gpudoctor.engine import sort_key  # noqa: PLC0415 - the engine's imports, only once something was verified
    from gpudoctor.rules.account import with_verifications  # noqa: PLC0415

    # the verdicts change the advice: a confirmed fix ranks by what it measured, a refuted one drops
    # out of the top actions into "tried, did not help"
    findings = tuple(sorted(findings, key=sort_key))
    return dataclasses.replace(report, findings=findings, summary=summary,
                               account=with_verifications(report.account, findings))


MEASURED = "Measured by --verify:"  # the sentence a ladder's best setting adds to a fix's instruction


def with_verification(f: Finding, v: Verification | None) -> Finding:
    """``f`` with ``v``; when the ladder confirmed a setting other than the fix's first one, the fix's
    instruction and its after-snippet name the measured value, and say how it was measured."""
    f = dataclasses.replace(f, verification=v)
    if v is None or v.status != VerifyStatus.CONFIRMED or not v.measured_best or not v.ladder:
        return f
    first, best = v.ladder[0], v.measured_best
    if MEASURED in f.fix.instruction:
        return f
    old = re.compile(rf"\b{re.escape(first.knob)}=\s*{first.value}\b")
    ci = f" ({v.confidence_pct:g}% CI {_x(v.ci[0])}–{_x(v.ci[1])})" if v.ci else ""
    instruction = old.sub(best, f.fix.instruction).rstrip()
    instruction += (f" {MEASURED} {best} is the best setting tried, {_x(v.speedup)} faster{ci}; "
                    f"{first.knob}={first.value} gave {_x(first.speedup)} ({first.status.value}).")
    fix = dataclasses.replace(f.fix, instruction=instruction, after=old.sub(best, f.fix.after))
    return dataclasses.replace(f, fix=fix)


def progress_to_stderr(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass

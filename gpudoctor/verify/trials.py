"""Trial runs: where they go (and the lock on it), one run of the script, and the rounds of a
session against the untouched script, with the looks at each fix's interval."""

from __future__ import annotations

import fcntl
import math
import os
import shutil
import signal
import stat
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.config import Config
from gpudoctor.errors import GpudoctorError, UsageError
from gpudoctor.model import (
    Injection,
    Manifest,
    RunData,
    RunStatus,
    Verification,
    VerifyStatus,
    layout,
)
from gpudoctor.safe import terminal_line as safe_line
from gpudoctor.signals import signum_of
from gpudoctor.verify.judging import (
    _cores,
    _ms,
    _steady,
    _trial_figures,
    judge,
    profiled_step_ns,
    undecided,
)
from gpudoctor.verify.ladder import _climb
from gpudoctor.verify.plan import (
    MARKER,
    SAMPLE_INTERVAL_MS,
    VerifyOptions,
    _Arm,
    _changes_text,
    _Run,
    _say,
)


def trials_dir(run_dir: Path, opts: VerifyOptions) -> Path:
    """Where the trial runs go: ``--out DIR``, else ``RUN/verify``."""
    return Path(opts.out_dir) if opts.out_dir is not None else run_dir / layout.VERIFY_DIR


def _verify_dir(d: Path) -> Path:
    """The trial runs' folder, emptied when an earlier ``verify`` made it; refused when it is not ours
    (an existing folder with files gpudoctor did not write), and a one-line error with what to do when
    it cannot be written (a read-only run directory: ``--out DIR``)."""
    try:
        if d.exists():
            if not d.is_dir():
                raise UsageError(f"{d} is not a folder: pass --out with a folder for the trial runs")
            if not (d / MARKER).is_file() and any(d.iterdir()):
                raise UsageError(f"{d} exists and was not made by gpudoctor: move it away, or pass --out with "
                                 "another folder for the trial runs")
            shutil.rmtree(d)
        d.mkdir(parents=True)
        (d / MARKER).write_text("trial runs of `gpudoctor verify`; replaced by the next one\n", encoding="utf-8")
    except OSError as err:
        raise UsageError(f"cannot write the trial runs into {d}: {err.strerror or err}; pass --out DIR "
                         "(a writable folder) to verify a read-only run") from None
    return d


@contextmanager
def _verify_lock(d: Path):
    """One ``verify`` at a time per trial folder: a second one fails at once with what to do, instead
    of emptying the first one's runs. The lock (``.NAME.lock`` beside the folder) is released when the
    process ends, however it ends."""
    lock = d.parent / layout.lock_name(d.name)
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    except OSError as err:
        raise UsageError(f"cannot write the trial runs beside {d}: {err.strerror or err}; pass --out DIR "
                         "(a writable folder) to verify a read-only run") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise UsageError(f"another `gpudoctor verify` is running trials in {d}; wait for it to finish, or "
                             "pass --out with another folder") from None
        yield
    finally:
        os.close(fd)


def _estimate_s(run: RunData, steps: int) -> float:
    """How long one trial run should take, from the profiled run: start-up + steps × median step."""
    mf = run.manifest
    recs = sorted(run.steps, key=lambda s: s.index)
    if recs:
        walls = sorted(s.wall_ns for s in recs)
        return (recs[0].start_ns + steps * walls[len(walls) // 2]) / 1e9
    return float(mf.duration_s or 0.0) if mf is not None else 0.0


def _trial(manifest: Manifest, run_dir: Path, rel: str, changes: tuple[Injection, ...],
           opts: VerifyOptions, timeout_s: float, rnd: int = 0) -> _Run:
    """One trial run of the script as ``manifest`` recorded it, into ``run_dir / rel``."""
    from gpudoctor.analysis.load import host_load  # noqa: PLC0415
    from gpudoctor.collect import ProfileOptions, profile_run  # noqa: PLC0415
    from gpudoctor.parse.rundir import read_samples, read_settings, read_steps  # noqa: PLC0415

    script, module, args = trial_target(manifest)  # what _check_target checked
    target = run_dir / rel
    t0 = time.monotonic()
    result = profile_run(
        ProfileOptions(
            script=script,
            module=module,
            args=args,
            cwd=manifest.cwd,
            run_dir=target,
            max_steps=opts.steps,
            torch_profiler=False,
            cprofile=False,
            summary=False,
            output_log=True,
            injections=changes,
            command=manifest.command,
            timeout_s=max(1.0, timeout_s),
            sample_interval_ms=SAMPLE_INTERVAL_MS,
            record_trust=False,
        )
    )
    duration = time.monotonic() - t0
    notes: list[str] = []
    steps = list(read_steps(target, notes))
    settings = read_settings(target, notes)
    judged = [s for s in steps if s.index >= opts.warmup_steps] or steps
    load = None
    if judged:
        span = (min(s.start_ns for s in judged), max(s.start_ns + s.wall_ns for s in judged))
        load = host_load(read_samples(target, notes), *span)
    m = result.manifest
    got = tuple(getattr(result, "signals", ()) or ())
    if m.status in (RunStatus.COMPLETED, RunStatus.STOPPED) and m.exit_code == 0 and not got:
        return _Run(rel, True, steps, settings, duration, status=m.status.value, round=rnd, load=load)
    what = m.status_detail or m.status.value
    if m.exception is not None:
        what = f"{m.exception.type}: {m.exception.message.splitlines()[0] if m.exception.message else ''}"
        if m.exception.call_site is not None:
            what += f" at {m.exception.call_site}"
    return _Run(rel, False, steps, settings, duration, error=f"{rel}: {m.status.value}: {what} (see {rel}/{layout.OUTPUT_LOG})",
                status=m.status.value, round=rnd, load=load, signals=got)



@dataclass(slots=True)
class _Session:
    """The trial runs of one verify: where they go, the budget, what stopped them."""

    manifest: Manifest
    run_dir: Path
    rdir: Path
    opts: VerifyOptions
    estimate_s: float
    t0: float = field(default_factory=time.monotonic)
    rounds: int = 0  # rounds started
    started: int = 0  # runs started
    interrupted: bool = False
    signum: int | None = None  # the signal that interrupted it (SIGINT, SIGTERM, SIGHUP)
    out_of_budget: bool = False
    baseline: _Arm | None = None  # the untouched script's runs, every round
    # why the budget stopped the rounds: the round that did not fit, what it needed, what was left (seconds)
    short: tuple[int, float, float] | None = None

    def left_s(self) -> float:
        return self.opts.budget_s - (time.monotonic() - self.t0)

    def arm_estimate_s(self, arm: _Arm) -> float:
        """How long a run of ``arm`` should take: its own longest run so far, else the profiled run's
        estimate. An arm's own runs: a fix that makes the script faster shortens its runs, and the
        baseline's longest run is no measure of them (a round of 33 s and 24 s runs is 57 s, not 66)."""
        own = [r.duration_s for r in arm.runs if r.duration_s > 0]
        return max(own) if own else self.estimate_s

    def round_estimate_s(self, arms: Sequence[_Arm]) -> float:
        """How long a round of ``arms`` and a baseline run should take."""
        units = [self.baseline, *arms] if self.baseline is not None else list(arms)
        return sum(self.arm_estimate_s(a) for a in units)

    def round(self, baseline: _Arm, arms: Sequence[_Arm], what: str = "") -> bool:
        """One round: a baseline run and a run of each arm, in an order that rotates every round.
        False when the budget or Ctrl-C stopped it (the runs made are kept). Once runs were timed, a
        round starts only when the whole of it fits in the budget: half a round (a baseline run alone)
        adds nothing to judge a fix by."""
        opts = self.opts
        units = [baseline, *arms]
        if any(u.runs for u in units):
            need, left = sum(self.arm_estimate_s(u) for u in units), self.left_s()
            if left < need:
                self.out_of_budget = True
                self.short = (self.rounds + 1, need, left)
                return False
        self.rounds += 1
        rnd = self.rounds
        k = (rnd - 1) % len(units)
        order = units[k:] + units[:k]
        for arm in order:
            left = self.left_s()
            if left < self.arm_estimate_s(arm):
                self.out_of_budget = True
                self.short = (rnd, self.arm_estimate_s(arm), left)
                return False
            rel = _rel(self.run_dir, self.rdir / arm.label / str(rnd))
            desc = "baseline (no change)" if not arm.changes else f"{arm.label} fix ({_changes_text(arm.changes)})"
            _say(opts, f"gpudoctor: verify [{time.monotonic() - self.t0:.0f}/{opts.budget_s:g} s] "
                       f"round {rnd}{what}: {desc}")
            self.started += 1
            try:
                r = _trial(self.manifest, self.run_dir, rel, arm.changes, opts, left, rnd)
            except GpudoctorError as err:
                r = _Run(rel, False, [], None, 0.0, error=f"{rel}: could not start: {err}", round=rnd)
            except KeyboardInterrupt as exc:
                self.interrupted = True
                self.signum = signum_of(exc)
                return False
            arm.runs.append(r)
            self.estimate_s = max(self.estimate_s, r.duration_s)
            steady = _steady(r, opts.warmup_steps)
            figs = _trial_figures(steady) if steady else None
            per = figs.step_ns if figs is not None else None
            med = figs.median_ns if figs is not None else None
            busy = ""
            if r.load is not None and r.load.others_cpu_pct is not None:
                busy = f", other processes {_cores(r.load.others_cpu_pct)} cores"
            _say(opts, "gpudoctor: verify   " + (
                f"{len(r.steps)} steps in {r.duration_s:.1f} s, {_ms(per)} per steady step (median {_ms(med)}){busy}"
                if r.ok else r.error
            ))
            if r.status == RunStatus.INTERRUPTED.value or r.signals:
                # Ctrl-C, or SIGTERM/SIGHUP passed on to the trial (a CI cancel, `timeout`): stop at the first
                self.interrupted = True
                self.signum = r.signals[0] if r.signals else int(signal.SIGINT)
                arm.runs.pop()  # an interrupted run is neither side's evidence
                return False
        return True

    def fits_round(self, arms: Sequence[_Arm]) -> bool:
        """A whole round of ``arms`` and a baseline run fits in what is left of the budget."""
        need, left = self.round_estimate_s(arms), self.left_s()
        if left < need:
            self.short = (self.rounds + 1, need, left)
            return False
        return True

    def budget_note(self) -> str:
        """Why fewer rounds ran than asked, when the budget is why: for a verdict that has too few runs."""
        if self.short is None:
            return ""
        rnd, need, left = self.short
        done = rnd - 1
        asked = self.opts.trials
        want = self.opts.budget_s + max(need - left, 0.0)
        held = f"{done} round{'s' if done != 1 else ''}" if done else "no whole round"
        budget = f"the --verify-budget of {self.opts.budget_s:g} s"
        if done >= asked:  # the rounds asked ran: more rounds for an undecided fix, or the ladder's, did not
            return (f"{budget} held {held} ({asked} asked, the rest for what stayed undecided); the next needed "
                    f"about {need:.0f} s, {max(left, 0.0):.0f} s were left")
        return (f"{budget} held {held} of the {asked} asked (round {rnd} needed about {need:.0f} s, "
                f"{max(left, 0.0):.0f} s were left): give --verify-budget {math.ceil(want / 10.0) * 10:g} or more")


def measure(
    run: RunData,
    arms: Sequence[_Arm],
    config: Config | None = None,
    opts: VerifyOptions | None = None,
) -> tuple[dict[str, Verification], _Session | None]:
    """Interleaved rounds of ``arms`` against the untouched script, looked at after ``trials`` rounds
    and, for the arms still undecided, after up to ``rounds_max`` rounds; then the ladder of the sized
    knobs not confirmed. Returns each arm's verdict by label (a ladder's best rung replaces its first
    setting's), and the session (None when nothing ran)."""
    opts = opts or VerifyOptions()
    config = config or Config()
    if not arms:
        return {}, None
    assert run.manifest is not None
    run_dir = Path(run.source)
    _check_target(run.manifest, run_dir, opts)
    d = trials_dir(run_dir, opts)
    with _verify_lock(d):
        return _measure(run, arms, config, opts, run_dir, _verify_dir(d))


def _measure(run: RunData, arms: Sequence[_Arm], config: Config, opts: VerifyOptions, run_dir: Path,
             rdir: Path) -> tuple[dict[str, Verification], _Session | None]:
    t = config.thresholds
    assert run.manifest is not None
    _say(opts, f"gpudoctor: verify: each trial runs, in {safe_line(os.path.abspath(run.manifest.cwd))}: "
               f"{trial_command(run.manifest)}")
    session = _Session(run.manifest, run_dir, rdir, opts, max(_estimate_s(run, opts.steps), 0.1))
    baseline = session.baseline = _Arm("baseline", ())
    profiled = profiled_step_ns(run)
    looks = opts.max_looks
    more = f" (up to {opts.rounds_max} for a fix still undecided)" if looks > 1 else ""
    _say(opts, f"gpudoctor: verify: {len(arms)} fix(es) to try ({', '.join(a.label for a in arms)}), "
               f"{opts.trials} round(s){more} of {len(arms) + 1} runs of {opts.steps} steps, budget "
               f"{opts.budget_s:g} s; trial runs in {rdir}")
    out: dict[str, Verification] = {}
    try:
        for _ in range(opts.trials):
            if not session.round(baseline, arms, f"/{opts.trials}"):
                break
        open_arms = []
        for arm in arms:
            if not arm.runs:
                continue
            v = judge(arm, baseline, t, opts, session.interrupted, looks=1, max_looks=looks, profiled_ns=profiled,
                      short=session.budget_note())
            out[arm.label] = v
            if undecided(v) and looks > 1:
                open_arms.append(arm)
        if open_arms and not (session.interrupted or session.out_of_budget):
            _say(opts, f"gpudoctor: verify: {', '.join(a.label for a in open_arms)} undecided after "
                       f"{opts.trials} round(s): more rounds, up to {opts.rounds_max}")
            extra = 0
            while extra < opts.rounds_max - opts.trials:
                if not session.fits_round(open_arms):
                    session.out_of_budget = True  # the verdict stays the first look's
                    break
                if not session.round(baseline, open_arms, " (more rounds)"):
                    break
                extra += 1
            if extra:
                for arm in open_arms:
                    out[arm.label] = judge(arm, baseline, t, opts, session.interrupted, looks=2, max_looks=looks,
                                           profiled_ns=profiled, short=session.budget_note())
        if opts.ladder:
            for arm in arms:
                v = out.get(arm.label)
                if v is not None and v.status in (VerifyStatus.REFUTED, VerifyStatus.INCONCLUSIVE) and not v.errors:
                    out[arm.label] = _climb(session, arm, v, baseline, t, profiled, run.settings)
    except KeyboardInterrupt as exc:
        session.interrupted = True
        session.signum = signum_of(exc)
    for arm in arms:  # what an interruption left unjudged
        if arm.label not in out and arm.runs:
            out[arm.label] = judge(arm, baseline, t, opts, session.interrupted, looks=1, max_looks=looks,
                                   profiled_ns=profiled, short=session.budget_note())
    if session.interrupted:
        _say(opts, "gpudoctor: verify: interrupted; judging what was measured")
    elif session.out_of_budget:
        spent = session.budget_note() or f"the budget of {opts.budget_s:g} s is spent"
        _say(opts, f"gpudoctor: verify: {spent}; judging what was measured")
    return out, session



def _rel(run_dir: Path, path: Path) -> str:
    """A trial run's folder as ``Verification.runs`` names it: relative to the run directory when inside
    it (``verify/GD201/1``), else absolute (``--out`` elsewhere)."""
    try:
        return str(path.resolve().relative_to(run_dir.resolve()))
    except ValueError:
        return str(path.resolve())


def trial_command(m: Manifest, python: str | None = None) -> str:
    """The command each trial runs, as a shell would show it: the interpreter (this one), then what
    ``trial_target`` hands the trial (``-m module``, or the script: ``argv[0]``, else ``script``) and the
    arguments; control characters escaped (``safe.terminal_line``)."""
    import shlex  # noqa: PLC0415

    script, module, args = trial_target(m)
    head = [python or sys.executable, *(("-m", module) if module else (script,) if script else ())]
    return safe_line(" ".join(shlex.quote(a) for a in (*head, *args)))


def trial_target(m: Manifest) -> tuple[str | None, str | None, tuple[str, ...]]:
    """What each trial runs, as ``_trial`` hands it to ``profile_run``: (script, module, arguments), from the
    manifest's ``argv`` (and ``module``), the run's own command line. ``_check_target`` checks this, resolved
    the way ``profile_run`` resolves it, and nothing else is run."""
    if m.module:
        return None, m.module, tuple(m.argv[1:])
    return (m.argv[0] if m.argv else m.script), None, tuple(m.argv[1:])


def _resolved(m: Manifest) -> str:
    """The file a trial runs: ``trial_target`` resolved by ``collect.options.validate`` in the run's working
    directory, as ``profile_run`` resolves it (a script against that folder, a module from it and sys.path)."""
    from gpudoctor.collect.options import ProfileOptions, validate  # noqa: PLC0415

    script, module, args = trial_target(m)
    if not script and not module:
        raise UsageError("the run names no script or module to run again; trials run what the run recorded")
    target = validate(ProfileOptions(script=script, module=module, args=args, cwd=m.cwd), m.cwd)
    path = target.script_path or target.module_origin
    if not path or not Path(path).is_file():
        raise UsageError(f"-m {safe_line(module)} resolves to no file in {safe_line(m.cwd)}: trials run the module "
                         "the run recorded")
    return path


def trial_sources(run_dir: Path) -> list[Path]:
    """The files the trials of ``run_dir`` would run or that the run profiled (as ``_check_target`` resolves
    them), for ``-o`` to never replace one; none for a run whose manifest cannot be read or names nothing
    (verify refuses it with its reason)."""
    from gpudoctor.parse.rundir import read_manifest  # noqa: PLC0415

    try:
        m = read_manifest(run_dir)
    except GpudoctorError:
        return []
    if m is None:
        return []
    out: list[Path] = []
    profiled = m.argv[0] if m.module and m.argv else m.script
    if profiled:
        out.append(Path(m.cwd, profiled))
    try:
        out.append(Path(_resolved(m)))
    except (GpudoctorError, OSError, ValueError):
        pass
    return out


def _what_runs(m: Manifest) -> tuple[object, ...]:
    """What a manifest decides about a trial: its folder, its target and arguments, the script's hash."""
    return m.cwd, trial_target(m), m.script_sha256


def trust_decision(run_dir: Path, m: Manifest) -> str:
    """"" when ``verify`` may run ``m``'s trials without asking: the manifest in ``run_dir`` is, byte for
    byte, one written by this user's gpudoctor (``gpudoctor.trust``: a keyed record kept outside the run
    directory; a copy of one's own run is one), and ``m`` names what it names; else why not, in words.
    No field of the manifest says whether it is trusted: an edited one, another user's, one from
    another machine, have no record."""
    import json  # noqa: PLC0415

    from gpudoctor import trust  # noqa: PLC0415

    p = Path(run_dir) / layout.MANIFEST
    try:  # never blocks on a FIFO planted as the manifest
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return f"its {layout.MANIFEST} is not a regular file"
            with os.fdopen(os.dup(fd), "rb") as fh:
                raw = fh.read()
        finally:
            os.close(fd)
    except OSError as err:
        return f"its {layout.MANIFEST} cannot be read ({err.strerror or err})"
    why = trust.check(Path(run_dir), raw)
    if why:
        return why
    try:  # bytes this user's gpudoctor wrote: read as they are, to compare with ``m``
        recorded = Manifest.from_dict(json.loads(raw.decode("utf-8")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"its {layout.MANIFEST} cannot be read by this gpudoctor"
    if _what_runs(recorded) != _what_runs(m):
        return f"the manifest verify was given differs from its {layout.MANIFEST}"
    return ""


def trial_lines(m: Manifest, path: str) -> str:
    """What the trials of ``m`` run, one item a line, for a person to check: the folder, the command,
    the file it runs."""
    return (f"  in:      {safe_line(os.path.abspath(m.cwd))}\n  command: {trial_command(m)}\n"
            f"  runs:    {safe_line(path)}")


def _check_target(m: Manifest, run_dir: Path, opts: VerifyOptions | None = None) -> None:
    """Before any trial. What the trials run is ``trial_target`` resolved as they will resolve it (it must
    exist), and it must have the bytes it had when profiled (``script_sha256``; a manifest without one
    counts as changed: ``--allow-changed``). A run directory is untrusted input: the trials run without
    asking only for a run this user's gpudoctor made and nobody changed since (``trust_decision``); else
    ``opts.confirm`` is asked with what they would run (a yes at a terminal), and without it or a yes
    the run is refused with the command and "pass --yes" (``opts.yes`` runs it)."""
    opts = opts or VerifyOptions()
    if not Path(m.cwd).is_dir():
        raise UsageError(f"the run's working directory {safe_line(m.cwd)} no longer exists: trials run the script "
                         "from there")
    path = _resolved(m)
    shown = safe_line(path)
    if not opts.allow_changed:
        if not m.script_sha256:
            raise UsageError(f"the run recorded no SHA-256 of {shown} (script_sha256: a run of an older gpudoctor, or "
                             "an edited manifest): verify cannot tell it is the script profiled; profile it again, or "
                             "pass --allow-changed to verify it as it is now")
        from gpudoctor.collect.runner import file_sha256  # noqa: PLC0415

        if file_sha256(path) != m.script_sha256:
            raise UsageError(f"{shown} changed since it was profiled: the trials would not measure the profiled "
                             "script; profile it again, or pass --allow-changed to verify it as it is now")
    if opts.yes:
        return
    why = trust_decision(run_dir, m)
    if not why:
        return
    run = safe_line(run_dir)
    if opts.confirm is not None and opts.confirm(
        f"gpudoctor: verify: {run} is not a run this user's gpudoctor made unchanged: {why}. Its trials would "
        f"run this script, as a program of yours, several times:\n{trial_lines(m, path)}\n"
        "gpudoctor: verify: run them? type yes to run the trials, anything else stops: "
    ):
        return
    raise UsageError(f"{run}: {why}; its trials would run, in {safe_line(os.path.abspath(m.cwd))}: "
                     f"{trial_command(m)} (the file {shown}): check that this is what you mean to run, and pass "
                     "--yes to run it")

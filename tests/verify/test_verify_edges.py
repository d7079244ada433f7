"""verify at the edges (issue: hold the contract at the edges, items 2, 6 and 7): an untrusted run
directory, a changed script, a read-only run, two verifies of one run, budgets that are not numbers,
and a SIGTERM that must stop the trials at once. What verify trusts (a record of the manifest kept
outside the run directory) is test_verify_trust.py's."""

from __future__ import annotations

import dataclasses
import hashlib
import signal
import sys
import threading
from pathlib import Path

import pytest
from test_verify_measure import _data, _fake, _workers

from gpudoctor import verify
from gpudoctor.config import Config
from gpudoctor.errors import UsageError
from gpudoctor.model import VerifyStatus
from gpudoctor.verify import VerifyOptions, _Arm, _Run, _verify_lock, measure, trial_command

# the runs here are built in memory, with no manifest on disk to trust: --yes, except where trust is tested
OPTS = VerifyOptions(steps=30, trials=3, yes=True)
ASK = dataclasses.replace(OPTS, yes=False)


def _with(run, **manifest_changes):
    return dataclasses.replace(run, manifest=dataclasses.replace(run.manifest, **manifest_changes))


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 0.0, -5.0])
def test_a_budget_that_is_not_a_finite_positive_number_is_refused(budget: float) -> None:
    with pytest.raises(UsageError, match="--verify-budget"):
        VerifyOptions(budget_s=budget).check()


def test_a_script_outside_the_recorded_working_directory_is_refused_without_yes(tmp_path, monkeypatch) -> None:
    """verify runs whatever script the manifest names: a run with no trust record (built here, never
    written by profile) runs nothing without --yes, and says what it would run."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text("pass\n")
    (tmp_path / "work").mkdir()
    data = _with(_data(tmp_path / "work"), script=str(elsewhere / "evil.py"), argv=(str(elsewhere / "evil.py"),),
                 script_sha256=hashlib.sha256(b"pass\n").hexdigest())
    with pytest.raises(UsageError, match=r"its trials would run, in .*/work: .* .*elsewhere/evil\.py.*--yes"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), ASK)
    assert calls == []  # nothing ran
    out, _ = measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert out["GD201"].status == VerifyStatus.CONFIRMED


def test_a_script_that_changed_since_it_was_profiled_is_refused_without_allow_changed(tmp_path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _data(tmp_path)
    script = Path(data.manifest.script)
    data = _with(data, script_sha256=hashlib.sha256(script.read_bytes()).hexdigest())
    measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)  # unchanged: runs
    ran = len(calls)
    script.write_text("print('edited')\n")
    with pytest.raises(UsageError, match="changed since it was profiled.*--allow-changed"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert len(calls) == ran
    measure(data, [_Arm("GD201", (_workers(1),))], Config(), dataclasses.replace(OPTS, allow_changed=True))
    assert len(calls) > ran


def test_the_trials_go_to_out_and_are_named_there(tmp_path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    out_dir = tmp_path / "trials"
    out, _ = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(),
                     dataclasses.replace(OPTS, out_dir=out_dir))
    assert (out_dir / verify.MARKER).is_file()
    assert all(Path(rel).is_absolute() and Path(rel).parent.parent == out_dir.resolve() for rel, _ in calls)
    assert not (tmp_path / "run" / "verify").exists()


def test_an_unwritable_trial_folder_says_pass_out(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")  # a file where the folder's parent should be: no write can go there
    with pytest.raises(UsageError, match="pass --out DIR"):
        verify._verify_dir(blocker / "verify")


def test_two_verifies_of_one_folder_do_not_run_at_once(tmp_path) -> None:
    d = tmp_path / "run" / "verify"
    inside = threading.Event()
    release = threading.Event()

    def first() -> None:
        with _verify_lock(d):
            inside.set()
            release.wait(10)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    try:
        with pytest.raises(UsageError, match="another `gpudoctor verify` is running"), _verify_lock(d):
            pass
    finally:
        release.set()
        t.join(10)
    with _verify_lock(d):  # free again once the first is done
        pass


def test_a_sigterm_passed_on_to_a_trial_stops_verify_at_once(tmp_path, monkeypatch) -> None:
    """verify printed "passing SIGTERM on to the script", then ran every remaining round and exited 0."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)

    def stopped(manifest, run_dir, rel, changes, opts, timeout_s, rnd=0):
        r = trial(manifest, run_dir, rel, changes, opts, timeout_s, rnd)
        if len(calls) == 2:  # the second trial got the SIGTERM gpudoctor passed on
            return dataclasses.replace(r, ok=False, status="killed", signals=(int(signal.SIGTERM),),
                                       error=f"{rel}: killed: terminated by signal 15 (SIGTERM)")
        return r

    monkeypatch.setattr(verify.trials, "_trial", stopped)
    out, session = measure(_data(tmp_path), [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert len(calls) == 2 and session.interrupted and session.signum == signal.SIGTERM
    assert all(isinstance(r, _Run) for r in session.baseline.runs)


def test_the_command_each_trial_runs_is_shown_as_a_shell_would(tmp_path) -> None:
    m = _data(tmp_path).manifest
    m = dataclasses.replace(m, argv=(m.script, "--epochs", "1", "it's"))
    assert trial_command(m, "python") == f"python {m.script} --epochs 1 'it'\"'\"'s'"
    assert trial_command(m).startswith(sys.executable + " ")  # the interpreter the trials run


# --------------------------------------------------------------------------- verify runs only what it checked (issue 38)


def _hashed(tmp_path: Path):
    data = _data(tmp_path)
    script = Path(data.manifest.script)
    return _with(data, script_sha256=hashlib.sha256(script.read_bytes()).hexdigest())


def test_an_edited_argv0_out_of_the_folder_is_refused_without_yes(tmp_path, monkeypatch) -> None:
    """The guard checked manifest.script, but the trials ran manifest.argv[0]: with argv[0] edited to
    ../elsewhere/evil.py, verify ran it twice, exit 0, no --yes. The target is argv[0], and its hash is
    checked (--yes runs an untrusted run, never bytes other than the profiled script's)."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "evil.py").write_text("print('evil')\n")
    (tmp_path / "work").mkdir()
    data = _with(_hashed(tmp_path / "work"), argv=("../elsewhere/evil.py", "--epochs", "1"))
    for opts in (ASK, OPTS):
        with pytest.raises(UsageError, match=r"evil\.py changed since it was profiled.*--allow-changed"):
            measure(data, [_Arm("GD201", (_workers(1),))], Config(), opts)
    assert calls == []
    changed = dataclasses.replace(ASK, allow_changed=True)
    with pytest.raises(UsageError, match=r"would run, in .*: .* \.\./elsewhere/evil\.py --epochs 1 .*--yes"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), changed)
    assert calls == []


def test_an_edited_argv0_inside_the_folder_runs_nothing_without_yes(tmp_path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _hashed(tmp_path)
    (tmp_path / "other.py").write_bytes(Path(data.manifest.script).read_bytes())  # the same bytes, another file
    data = _with(data, argv=("other.py",))
    with pytest.raises(UsageError, match=r"would run, in .*: \S+ other\.py \(the file .*other\.py\).*--yes"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), ASK)
    assert calls == []


def test_a_manifest_without_a_hash_counts_as_a_changed_script(tmp_path, monkeypatch) -> None:
    """A manifest without script_sha256 skipped the changed-script check silently."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    data = _with(_data(tmp_path), script_sha256=None)
    with pytest.raises(UsageError, match=r"recorded no SHA-256 .*train\.py.*--allow-changed"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert calls == []
    out, _ = measure(data, [_Arm("GD201", (_workers(1),))], Config(), dataclasses.replace(OPTS, allow_changed=True))
    assert calls and out["GD201"].status == VerifyStatus.CONFIRMED


def test_a_module_run_is_checked_as_the_module_resolves(tmp_path, monkeypatch) -> None:
    """-m: the file the module resolves to from the run's folder is the target, with its hash."""
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("pass\n")
    data = _with(_data(tmp_path), module="pkg.train", script=None, argv=(str(pkg / "train.py"), "--epochs", "1"),
                 script_sha256=hashlib.sha256(b"pass\n").hexdigest())
    measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    ran = len(calls)
    assert ran
    (pkg / "train.py").write_text("print('edited')\n")
    with pytest.raises(UsageError, match=r"pkg/train\.py changed since it was profiled"):
        measure(data, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    (pkg / "train.py").write_text("pass\n")
    (tmp_path / "pkg2").mkdir()
    moved = _with(data, module="pkg2.train")
    with pytest.raises(UsageError, match=r"no module named 'pkg2\.train'"):
        measure(moved, [_Arm("GD201", (_workers(1),))], Config(), OPTS)
    assert len(calls) == ran


def test_a_trial_runs_what_was_checked(tmp_path, monkeypatch) -> None:
    """_trial hands profile_run the script, module and arguments _check_target resolved and checked."""
    import gpudoctor.collect as collect

    seen = []

    class Stop(Exception):
        pass

    def record(opts):
        seen.append((opts.script, opts.module, opts.args, opts.cwd))
        raise Stop

    monkeypatch.setattr(collect, "profile_run", record)
    m = _with(_hashed(tmp_path), argv=("train.py", "--lr", "0.1")).manifest
    verify.trials._check_target(m, tmp_path / "run", OPTS)
    with pytest.raises(Stop):
        verify.trials._trial(m, tmp_path / "run", "verify/baseline/1", (), OPTS, 60.0)
    assert seen == [("train.py", None, ("--lr", "0.1"), str(tmp_path))]
    assert verify.trials.trial_target(m) == ("train.py", None, ("--lr", "0.1"))

"""What ``verify`` trusts (issue 41, item 1): a record of the manifest's exact bytes, keyed with a
per-user secret and kept outside the run directory (gpudoctor/trust.py), made by ``profile``; never a
field of the manifest. A run without one runs only with --yes or a yes typed at a terminal, after the
exact command was shown. The tampered run directories through the real CLI: test_verify_tampered.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rule_builders import cpu_manifest
from test_verify_measure import _fake
from test_verify_tampered import TIMEIT, _tampered

from gpudoctor import cli, trust, verify
from gpudoctor.errors import UsageError
from gpudoctor.model import Manifest
from gpudoctor.parse.rundir import read_manifest
from gpudoctor.verify import VerifyOptions, trial_command, trust_decision
from gpudoctor.verify.trials import _check_target

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "state"
    monkeypatch.setenv(trust.STATE_ENV, str(d))
    return d


def _write_run(tmp_path: Path, **changes) -> tuple[Path, Manifest]:
    """A run directory whose manifest names train.py in ``tmp_path`` (with its hash), as profile writes it."""
    (tmp_path / "train.py").write_text("pass\n")
    m = cpu_manifest(cwd=str(tmp_path), script=str(tmp_path / "train.py"), argv=(str(tmp_path / "train.py"),),
                     script_sha256=hashlib.sha256(b"pass\n").hexdigest(), **changes)
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps(m.to_dict(), indent=2) + "\n")
    return run, read_manifest(run)


# --------------------------------------------------------------------------- the record


def test_a_recorded_manifest_is_trusted_byte_for_byte(tmp_path: Path, state: Path) -> None:
    run, _ = _write_run(tmp_path)
    raw = (run / "manifest.json").read_bytes()
    assert trust.check(run, raw) == trust.UNRECORDED and not state.exists()  # a check creates nothing
    trust.record(run)
    assert trust.trusted(run, raw)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert stat.S_IMODE((state / trust.KEY_NAME).stat().st_mode) == 0o600
    assert not trust.trusted(run, raw.replace(b"\n", b" \n", 1))  # one byte of whitespace changes it
    assert not trust.trusted(run, raw.replace(b"train.py", b"evil.py"))
    copy = tmp_path / "moved"
    shutil.copytree(run, copy)  # a copy of one's own run names the same folder, script and hash
    assert trust.trusted(copy, (copy / "manifest.json").read_bytes())
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]  # nothing is kept in the run directory


def test_another_users_secret_trusts_nothing(tmp_path: Path, state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded by another user (another secret) is not trusted here, and nor is a record of an
    edited manifest made with another secret and copied into this user's records."""
    run, _ = _write_run(tmp_path)
    p = run / "manifest.json"
    trust.record(run)
    mine = p.read_bytes()
    other = tmp_path / "other-user"
    monkeypatch.setenv(trust.STATE_ENV, str(other))
    assert trust.check(run, mine) == trust.UNRECORDED
    p.write_bytes(mine.replace(b"train.py", b"evil.py"))
    trust.record(run)  # the other secret's record of the edited manifest
    assert trust.trusted(run, p.read_bytes())
    monkeypatch.setenv(trust.STATE_ENV, str(state))
    for rec in (other / trust.RECORDS).iterdir():
        shutil.copy(rec, state / trust.RECORDS / rec.name)
    assert not trust.trusted(run, p.read_bytes()) and trust.trusted(run, mine)


def test_a_secret_others_can_read_or_write_proves_nothing(tmp_path: Path, state: Path) -> None:
    run, _ = _write_run(tmp_path)
    trust.record(run)
    raw = (run / "manifest.json").read_bytes()
    key = state / trust.KEY_NAME
    key.chmod(0o644)
    assert not trust.trusted(run, raw)
    with pytest.raises(OSError, match="read or written by others"):
        trust.record(run)
    key.chmod(0o600)
    state.chmod(0o777)
    assert not trust.trusted(run, raw)
    state.chmod(0o700)
    assert trust.trusted(run, raw)


def test_the_state_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(trust.STATE_ENV, str(tmp_path / "s"))
    assert trust.state_dir() == tmp_path / "s"
    monkeypatch.delenv(trust.STATE_ENV)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert trust.state_dir() == tmp_path / "xdg" / "gpudoctor"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # not absolute: ignored, as the XDG spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert trust.state_dir() == tmp_path / "home" / ".local" / "state" / "gpudoctor"


def test_a_state_folder_that_cannot_be_written_costs_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    from gpudoctor.collect import runner

    run, _ = _write_run(tmp_path)
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv(trust.STATE_ENV, str(tmp_path / "file" / "state"))
    runner._record_trust(run)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not record this run as yours" in err[0] and trust.STATE_ENV in err[0]


# --------------------------------------------------------------------------- the decision


def test_the_decision_reads_the_record_never_the_manifest(tmp_path: Path, state: Path) -> None:
    run, m = _write_run(tmp_path)
    assert trust_decision(run, m) == trust.UNRECORDED
    trust.record(run)
    assert trust_decision(run, m) == ""
    # the manifest handed to verify must be the one recorded (what runs is what was trusted)
    other = dataclasses.replace(m, argv=(m.script, "--evil"))
    assert "the manifest verify was given differs from its manifest.json" in trust_decision(run, other)
    # an edit of the file, even one that keeps the JSON's meaning, is not trusted
    p = run / "manifest.json"
    p.write_bytes(p.read_bytes() + b"\n")
    assert trust_decision(run, m) == trust.UNRECORDED
    p.unlink()
    os.mkfifo(p)  # a FIFO planted as the manifest: refused, never waited on
    assert "not a regular file" in trust_decision(run, m)


def test_an_untrusted_run_asks_and_shows_what_runs(tmp_path: Path, state: Path) -> None:
    run, m = _write_run(tmp_path)
    with pytest.raises(UsageError) as err:
        _check_target(m, run, VerifyOptions())
    line = str(err.value)
    assert "\n" not in line and line.endswith("pass --yes to run it")
    assert f"its trials would run, in {tmp_path}: {sys.executable} {m.script}" in line
    asked: list[str] = []

    def no(text: str) -> bool:
        asked.append(text)
        return False

    with pytest.raises(UsageError, match="--yes"):
        _check_target(m, run, VerifyOptions(confirm=no))
    assert len(asked) == 1 and f"in:      {tmp_path}" in asked[0] and f"command: {sys.executable} {m.script}" in asked[0]
    _check_target(m, run, VerifyOptions(confirm=lambda text: True))  # a yes at the terminal runs it
    _check_target(m, run, VerifyOptions(yes=True))  # --yes runs it
    trust.record(run)
    _check_target(m, run, VerifyOptions(confirm=no))  # trusted: nothing asked
    assert len(asked) == 1


def test_yes_never_skips_the_changed_script_check(tmp_path: Path, state: Path) -> None:
    run, m = _write_run(tmp_path)
    trust.record(run)
    Path(m.script).write_text("print('edited')\n")
    for opts in (VerifyOptions(), VerifyOptions(yes=True)):
        with pytest.raises(UsageError, match="changed since it was profiled.*--allow-changed"):
            _check_target(m, run, opts)
    _check_target(m, run, VerifyOptions(allow_changed=True))


def test_the_command_shown_is_what_runs(tmp_path: Path) -> None:
    """With argv empty the trial runs ``script``: the command said ``python`` alone."""
    m = cpu_manifest(cwd=str(tmp_path), script="train.py", argv=())
    assert verify.trials.trial_target(m) == ("train.py", None, ())
    assert trial_command(m, "python") == "python train.py"
    m = cpu_manifest(cwd=str(tmp_path), script=None, module="pkg.train", argv=("/x/pkg/train.py", "--lr", "1"))
    assert trial_command(m, "python") == "python -m pkg.train --lr 1"
    m = cpu_manifest(cwd=str(tmp_path), script="t.py", argv=("t.py", "\x1b]0;PWN\x07"))
    assert "\x1b" not in trial_command(m) and "\x07" not in trial_command(m)


# --------------------------------------------------------------------------- the CLI at a terminal


@pytest.mark.parametrize("answer", ["no\n", "", "yes\n"])
def test_a_terminal_is_asked_and_only_yes_runs_the_trials(tmp_path: Path, monkeypatch, answer: str) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    monkeypatch.setattr(cli, "at_terminal", lambda: True)
    marker = tmp_path / "MARKER"
    run = _tampered(tmp_path, "stdlib-script", marker)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli.cli, ["verify", str(run), "--verify-budget", "600", "--format", "json"], input=answer)
    assert "is not a run this user's gpudoctor made unchanged" in res.stderr
    assert "  in:      /\n" in res.stderr and f"  command: {sys.executable} {TIMEIT} -n 1 -r 1 -s " in res.stderr
    assert "run them? type yes" in res.stderr
    if answer == "yes\n":
        assert res.exit_code == 0, res.stderr[-2000:]
        assert calls  # the trials ran (stood in for here)
    else:
        # in-process the error is raised to the runner; the real CLI prints it, exit 2 (test_verify_tampered.py)
        assert isinstance(res.exception, UsageError) and "pass --yes to run it" in str(res.exception)
        assert calls == []
    assert not marker.exists()


def test_without_a_terminal_the_cli_refuses_at_once(tmp_path: Path, monkeypatch) -> None:
    trial, calls = _fake(lambda ch: 20.0 if ch else 30.0)
    monkeypatch.setattr(verify.trials, "_trial", trial)
    monkeypatch.setattr(cli, "at_terminal", lambda: False)
    run = _tampered(tmp_path, "stdlib-module", tmp_path / "MARKER")
    res = CliRunner().invoke(cli.cli, ["verify", str(run)], input="yes\n")  # a piped yes is not a person's
    assert isinstance(res.exception, UsageError) and calls == [] and "run them?" not in res.stderr
    assert "-m timeit" in str(res.exception) and "pass --yes to run it" in str(res.exception)


# --------------------------------------------------------------------------- a run profile made here


WAITING = """
import time
import torch
from torch.utils.data import DataLoader, TensorDataset


def collate(batch):
    time.sleep(0.03)  # a fetch: the loop waits for it, whatever else loads the machine
    return torch.stack([x for x, in batch])


model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in DataLoader(TensorDataset(torch.randn(4096, 8)), batch_size=16, collate_fn=collate):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.mark.slow
def test_a_run_profile_made_here_verifies_without_yes(tmp_path: Path) -> None:
    """The record is made where the run is made: ``gpudoctor profile`` (a real run, the session's state
    folder), then ``gpudoctor verify`` with no terminal and no --yes gets to its trials (GD201: a fix to
    try), asking nothing; so does a copy of the run; an edit of one byte of its manifest makes it ask."""
    (tmp_path / "waiting.py").write_text(WAITING)
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")

    def gd(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gpudoctor", *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)

    res = gd("profile", "--steps", "20", "--no-cprofile", "--no-report", "--out", "runs", "waiting.py")
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    # a budget no trial fits in: verify stops before the first one, past the check of what it may run; GD205's
    # busy machine (a shared CI runner) would leave GD201 nothing to try, and this is not about the load
    res = gd("verify", str(run), "--set", "cpu_contention_wait_pct=100", "--verify-budget", "0.5", "--format", "json",
             "-o", "verified.json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"gpudoctor: verify: each trial runs, in {tmp_path}: {sys.executable} waiting.py" in res.stderr
    assert "--yes" not in res.stderr and "run them?" not in res.stderr
    m = read_manifest(run)
    never = VerifyOptions(confirm=lambda text: pytest.fail("a trusted run was asked about"))
    assert trust_decision(run, m) == ""
    _check_target(m, run, never)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    _check_target(read_manifest(copy), copy, never)
    p = copy / "manifest.json"
    p.write_bytes(p.read_bytes().replace(b'"argv": [', b'"argv": [ ', 1))
    with pytest.raises(UsageError, match="no record that this user's gpudoctor wrote its manifest.*--yes"):
        _check_target(read_manifest(copy), copy, VerifyOptions())
    res = gd("verify", str(copy), "--set", "cpu_contention_wait_pct=100", "--verify-budget", "0.5")
    assert res.returncode == 2 and "pass --yes to run it" in res.stderr

"""The progress line of ``gpudoctor profile``: rendered from the run's files, in place, cleared,
only on a terminal, never under --quiet, and never a failure when stderr breaks."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from installlib import WINDOW, env, gd, write_train
from test_install_cli_conventions import os_close, read_pty

from gpudoctor.collect.progress import Progress, for_run

S = 1_000_000_000


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Broken(Terminal):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def progress(tmp_path: Path, stream, max_steps: int | None = None) -> Progress:
    return Progress(tmp_path / "steps.jsonl", tmp_path / ".child-state.json", t0_mono_ns=0, max_steps=max_steps,
                    stream=stream, interval_s=0.0)


def test_counts_whole_step_lines_and_the_windows_listed(tmp_path) -> None:
    p = progress(tmp_path, Terminal())
    assert p.line(3 * S) == "gpudoctor: running: 0 steps, 0 profiled windows recorded, 3 s"
    (tmp_path / "steps.jsonl").write_text('{"i": 0}\n{"i": 1}\n{"i": 2', encoding="utf-8")  # the third half-written
    (tmp_path / ".child-state.json").write_text(json.dumps({"traces": ["a.pt.trace.json.gz"]}), encoding="utf-8")
    p.tick()
    assert (p.steps, p.windows) == (2, 1)
    with open(tmp_path / "steps.jsonl", "a", encoding="utf-8") as fh:
        fh.write('}\n{"i": 3}\n')
    p.tick()
    assert p.steps == 4  # only the bytes appended are read; the line finished is counted once
    assert p.line(65 * S) == "gpudoctor: running: 4 steps, 1 profiled window recorded, 65 s"
    p.max_steps = 40
    assert p.line(65 * S).startswith("gpudoctor: running: 4/40 steps, ")


def test_rewrites_one_line_in_place_and_clears_it(tmp_path) -> None:
    term = Terminal()
    p = progress(tmp_path, term)
    (tmp_path / "steps.jsonl").write_text("{}\n" * 12, encoding="utf-8")
    p.tick()
    (tmp_path / "steps.jsonl").write_text("", encoding="utf-8")
    p.steps, p._offset = 0, 0  # a shorter line next
    p.tick()
    p.clear()
    out = term.getvalue()
    assert "\n" not in out
    first, second, cleared = out.split("\r")[1:4]
    assert first.startswith("gpudoctor: running: 12 steps")
    assert len(second) == len(first) and second.rstrip().startswith("gpudoctor: running: 0 steps")
    assert cleared == " " * len(second.rstrip()) and out.endswith("\r")


def test_the_line_fits_a_narrow_terminal(tmp_path) -> None:
    import pty

    master, slave = pty.openpty()
    try:
        os.set_blocking(master, False)
        subprocess.run(["stty", "cols", "30"], stdin=slave, check=True)
        with os.fdopen(os.dup(slave), "w") as stream:
            p = progress(tmp_path, stream)
            p.tick()
        shown = os.read(master, 4096).decode()
    finally:
        os.close(master)
        os.close(slave)
    assert shown.startswith("\rgpudoctor: running: ") and len(shown) == 1 + 29  # one column left for the cursor


def test_nothing_shown_nothing_cleared_off_a_terminal(tmp_path) -> None:
    pipe = io.StringIO()  # isatty() is False
    p = for_run(tmp_path, 0, None, launcher=False, stream=pipe)
    assert not p.enabled
    p.tick()
    p.clear()
    assert pipe.getvalue() == ""


def test_a_broken_stderr_turns_the_line_off(tmp_path) -> None:
    p = progress(tmp_path, Broken())
    p.tick()  # no exception
    assert not p.enabled
    p.tick()
    p.clear()


def test_torchrun_jobs_follow_the_lowest_rank(tmp_path) -> None:
    p = Progress(None, None, 0, stream=Terminal(), interval_s=0.0, run_dir=tmp_path)
    p.tick()
    assert p.steps == 0
    (tmp_path / "steps.rank1.jsonl").write_text("{}\n" * 5, encoding="utf-8")
    (tmp_path / "steps.rank0.jsonl").write_text("{}\n" * 3, encoding="utf-8")
    (tmp_path / ".child-state.rank0.json").write_text(json.dumps({"traces": ["a", "b"]}), encoding="utf-8")
    p.tick()
    assert (p.steps, p.windows) == (3, 2)


# --------------------------------------------------------------------------- end to end, on a pty


def profile_on_a_pty(folder: Path, *args: str) -> tuple[int, str, str]:
    """``gpudoctor profile`` with stderr on a pseudo-terminal (stdout a pipe): (exit code, stderr as the
    terminal got it, stdout)."""
    import pty

    master, slave = pty.openpty()
    stdout = folder / "stdout.txt"  # a file, not a pipe: nothing waits on a reader while the pty is read
    try:
        with open(stdout, "wb") as out_fh:
            proc = subprocess.Popen([sys.executable, "-m", "gpudoctor", "profile", "--out", "runs", *args, "train.py"],
                                    cwd=folder, env=env(STEPS="60"), stdin=subprocess.DEVNULL, stdout=out_fh,
                                    stderr=slave)
    finally:
        os_close(slave)
    err = read_pty(master, proc)
    return proc.returncode, err.replace("\r\n", "\n"), stdout.read_text(encoding="utf-8")



@pytest.mark.slow
def test_profile_shows_progress_on_a_terminal_and_clears_it(tmp_path) -> None:
    write_train(tmp_path)
    code, err, out = profile_on_a_pty(tmp_path, "--steps", "40", *WINDOW, "--format", "json")
    assert code == 0, err
    assert "\rgpudoctor: running: " in err
    shown = [s for s in err.split("\r") if s.startswith("gpudoctor: running: ")]
    assert shown and all("/40 steps, " in s and "profiled window" in s and s.rstrip().endswith(" s") for s in shown)
    # cleared before the closing summary: blanks over the last rendering, then the summary at column 0
    last = err.rindex("\rgpudoctor: running: ")
    tail = err[last + 1:]
    line, blank, rest = tail.split("\r", 2)
    assert blank.strip() == "" and len(blank) >= len(line.rstrip())
    assert rest.startswith("gpudoctor: 40 steps")
    assert json.loads(out)["kind"] == "profile"  # the report on stdout is untouched


@pytest.mark.slow
def test_no_progress_under_quiet_or_off_a_terminal(tmp_path) -> None:
    write_train(tmp_path)
    code, err, _ = profile_on_a_pty(tmp_path, "--steps", "20", *WINDOW, "--quiet")
    assert code == 0, err
    assert "running:" not in err and "\r" not in err.replace("\r\n", "\n")
    res = gd("profile", "--out", "runs2", "--steps", "20", *WINDOW, "train.py", cwd=tmp_path, extra_env={"STEPS": "60"})
    assert res.returncode == 0, res.stderr
    assert "running:" not in res.stderr and "\r" not in res.stderr
    assert os.listdir(tmp_path / "runs2")

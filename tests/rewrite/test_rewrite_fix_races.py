"""``check --fix`` when the file moves under it (issue 41, case 6): a file changed between the review and
the fix, swapped for a symlink, or that the rewrite cannot fix is "not written" (exit 1, one line); a
temporary file that a SIGKILL left is removed by the next ``--fix``; a hard link split is reported."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.cli import main

SCRIPTS = Path(__file__).resolve().parent / "scripts"
FIXED = "betas=(0.5, 0.999), fused=True)"  # GD404's fix in optimizers.py


def gpudoctor(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gpudoctor", *map(str, args)])
    with pytest.raises(SystemExit) as exc:
        main()
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _script(folder: Path) -> Path:
    folder.mkdir(exist_ok=True)
    target = folder / "optimizers.py"
    shutil.copyfile(SCRIPTS / "optimizers.py", target)
    return target


def _after_the_review(monkeypatch, change) -> None:
    """``change()`` runs once, right after the review (the first ``check_paths``) read the files."""
    import gpudoctor.autofix as autofix

    real = autofix.check_paths
    done: list[bool] = []

    def review_then_change(*args, **kwargs):
        report = real(*args, **kwargs)
        if not done:
            done.append(True)
            change()
        return report

    monkeypatch.setattr(autofix, "check_paths", review_then_change)


@pytest.mark.parametrize("how", ["saved", "symlink"])
def test_a_file_changed_after_the_review_is_not_written_and_exits_1(how, tmp_path, monkeypatch, capsys):
    """Saved from an editor (two lines added at the top) or swapped for a symlink to another file between
    the review's read and the fix's: exit 0 and "fixed 0 findings in 0 files" before; now exit 1, the file
    as the user left it, one line for it."""
    script = _script(tmp_path / "proj")
    edited = "# edited\n# meanwhile\n" + script.read_text(encoding="utf-8")
    other = tmp_path / "proj" / "other_copy.txt"

    def change() -> None:
        if how == "saved":
            script.write_text(edited, encoding="utf-8")
        else:
            other.write_text(edited, encoding="utf-8")
            script.unlink()
            script.symlink_to(other.name)

    _after_the_review(monkeypatch, change)
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj/optimizers.py")
    assert code == 1, err
    assert script.read_text(encoding="utf-8") == edited  # untouched (through the symlink too)
    assert (how == "symlink") == script.is_symlink()
    lines = [x for x in err.splitlines() if "optimizers.py: not fixed:" in x]
    assert len(lines) == 1 and "changed on disk while gpudoctor was reviewing it" in lines[0], err
    assert "1 file could not be written" in err


def test_a_file_the_rewrite_cannot_fix_counts_as_not_written(tmp_path, monkeypatch, capsys):
    """The RewriteError stored on the file (LibCST cannot parse it, the result would not compile) was
    never counted: exit 0. Now exit 1 with its line."""
    import gpudoctor.rewrite as rewrite

    def fail(text, edits):
        raise rewrite.RewriteError("the rewrite failed (ParserSyntaxError: simulated); nothing was changed")

    monkeypatch.setattr(rewrite, "apply", fail)
    script = _script(tmp_path)
    before = script.read_bytes()
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "optimizers.py")
    assert code == 1, err
    assert script.read_bytes() == before
    assert "optimizers.py: not fixed: the rewrite failed" in err and "could not be written" in err


def test_the_temporary_file_of_a_killed_fix_is_removed_by_the_next(tmp_path, monkeypatch, capsys):
    """SIGKILL while the fixed file is written leaves ``.optimizers.py.PID.tmp``; the next ``--fix`` removes
    it (its process is gone) and says so, and leaves alone a live process's and any other name. One with
    this process's own pid (a pid reused) is stale too: it would make the write fail (O_EXCL)."""
    script = _script(tmp_path)
    child = (
        "import sys, time\n"
        "from gpudoctor import output\n"
        "output._write_all = lambda fd, data: (__import__('os').write(fd, data[:10]), time.sleep(60))\n"
        "output.replace_file(sys.argv[1], b'x' * 100, 'fixed file')\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child, str(script)], env={**os.environ})
    stale = tmp_path / f".optimizers.py.{proc.pid}.tmp"
    try:
        deadline = time.monotonic() + 60
        while not stale.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert stale.exists(), "the write never started"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert stale.exists()  # what SIGKILL leaves
    live = tmp_path / f".optimizers.py.{os.getppid()}.tmp"  # a live process's: a write in progress
    live.write_text("in progress")
    other = tmp_path / f".optimizers.py.{proc.pid}.tmp.bak"  # not exactly ours
    other.write_text("keep")
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "optimizers.py")
    assert code == 0, err
    assert not stale.exists() and live.exists() and other.exists()
    assert f".optimizers.py.{proc.pid}.tmp: removed" in err
    assert FIXED in script.read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [live.name]
    reused = tmp_path / f".optimizers.py.{os.getpid()}.tmp"
    reused.write_text("left by an earlier process with this pid")
    script.write_bytes((SCRIPTS / "optimizers.py").read_bytes())
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "optimizers.py")
    assert code == 0 and not reused.exists() and FIXED in script.read_text(encoding="utf-8"), err


def test_a_hard_link_split_by_the_fix_is_reported(tmp_path, monkeypatch, capsys):
    """``--fix`` writes beside the file and renames it into place (atomic: a kill never leaves half a
    script), which gives this name a new file: the other links keep the old text, and stderr says so."""
    script = _script(tmp_path / "proj")
    alias = tmp_path / "alias.py"
    os.link(script, alias)
    before = alias.read_bytes()
    monkeypatch.chdir(tmp_path)
    code, _out, err = gpudoctor(monkeypatch, capsys, "check", "--fix", "proj/optimizers.py")
    assert code == 0, err
    assert FIXED in script.read_text(encoding="utf-8") and alias.read_bytes() == before
    assert os.stat(script).st_nlink == 1
    line = next(x for x in err.splitlines() if "hard links" in x)
    assert "optimizers.py: it had 2 hard links" in line and "other names keep the old text" in line

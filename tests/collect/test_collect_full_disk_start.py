"""A run onto a full disk (issue 41, case 7): ``profile`` exits 2 with one line, and leaves either a
readable run directory whose manifest says how the run ended, or no run directory at all (the empty one
removed, and said) — never an empty run directory. The full disk is simulated (ENOSPC from the
manifest's write); a real one is ``tests/faults/test_faults_writes.py``'s (root only, slow)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pytest

from gpudoctor.cli import main


def _profile(monkeypatch, capsys, tmp_path: Path) -> tuple[int, str]:
    (tmp_path / "train.py").write_text("raise SystemExit('the script must not run')\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["gpudoctor", "profile", "--out", "runs", "--no-report", "train.py"])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


def _full(when):
    from gpudoctor.collect import rundir

    real = rundir.write_json_atomic

    def write(path, obj, reserve_bytes=0):
        if when(reserve_bytes):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, obj, reserve_bytes=reserve_bytes)

    return write


def test_room_for_a_short_manifest_leaves_a_readable_run_that_says_how_it_ended(tmp_path, monkeypatch, capsys):
    """The manifest's reserve (32 kB) does not fit, a short manifest does: the run directory says the script
    was not run, and why; ``analyze``'s reader reads it."""
    from gpudoctor.collect import rundir
    from gpudoctor.model import RunStatus
    from gpudoctor.parse.rundir import read_manifest

    monkeypatch.setattr(rundir, "write_json_atomic", _full(lambda reserve: reserve > 0))
    code, err = _profile(monkeypatch, capsys, tmp_path)
    assert code == 2, err
    lines = [x for x in err.splitlines() if x.startswith("gpudoctor: error:")]
    assert len(lines) == 1 and "No space left on device (ENOSPC)" in lines[0] and "says so" in lines[0], err
    (run,) = (tmp_path / "runs").iterdir()
    m = read_manifest(run)
    assert m is not None and m.status == RunStatus.FAILED and m.ended_at
    assert "could not be written (No space left on device (ENOSPC)): the script was not run" in m.status_detail
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json"]  # no temporary left


def test_no_room_at_all_removes_the_empty_run_directory_and_says_so(tmp_path, monkeypatch, capsys):
    from gpudoctor.collect import rundir

    monkeypatch.setattr(rundir, "write_json_atomic", _full(lambda reserve: True))
    code, err = _profile(monkeypatch, capsys, tmp_path)
    assert code == 2, err
    assert list((tmp_path / "runs").iterdir()) == []
    lines = [x for x in err.splitlines() if x.startswith("gpudoctor: error:")]
    assert len(lines) == 1 and "No space left on device (ENOSPC)" in lines[0], err
    assert "the empty run directory" in lines[0] and "was removed" in lines[0]
    assert "Traceback" not in err

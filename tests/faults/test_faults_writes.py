"""Writes that cannot lie: a full disk, a file-size limit, a path Kineto cannot rename into.

Whatever could not be written is named in the manifest with the system's reason, the
instrument that lost it says ``failed`` or ``partial``, the terminal says so in one line,
and no file is deleted unless a verified copy of it exists.
"""

from __future__ import annotations

import errno
import gzip
import json
import marshal
from pathlib import Path

import pytest
from faultlib import (
    WINDOW,
    collected,
    gd,
    gd_lines,
    ignore_sigxfsz_and_limit,
    manifest,
    only_run_dir,
    small_filesystem,
    write_train,
)

pytestmark = pytest.mark.slow


def _readable_trace(path: Path) -> bool:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            return "traceEvents" in json.load(fh)
    except (OSError, ValueError, EOFError):
        return False


def _lines(path: Path) -> int:
    try:
        return sum(1 for line in path.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def _assert_honest(run: Path, script_code: int = 0) -> dict:
    """What the manifest says was collected is there and readable; what is not, it says."""
    m = manifest(run)
    assert m["status"] in ("completed", "stopped"), (m["status"], m["status_detail"])
    assert m["exit_code"] == script_code
    assert "os._exit" not in m["status_detail"], m["status_detail"]
    for t in m["traces"]:
        assert _readable_trace(run / t), f"{t} is listed but not readable"
    for c in collected(m, "torch.profiler"):
        if c["ok"] and not c.get("partial"):
            assert m["traces"], c
    for c in collected(m, "steps"):
        if c["ok"] and not c.get("partial"):
            assert _lines(run / "steps.jsonl") == m["steps_seen"], c
    for c in collected(m, "cprofile"):
        if c["ok"]:
            stats = marshal.loads((run / "profile.pstats").read_bytes())
            assert isinstance(stats, dict) and stats
    assert not list(run.glob("*.tmp")), list(run.glob("*.tmp"))
    return m


# --------------------------------------------------------------------------- a file-size limit (EFBIG): no root needed


def test_a_file_size_limit_is_reported_per_artifact(tmp_path: Path) -> None:
    write_train(tmp_path)
    done = gd("profile", "--out", "runs", *WINDOW, "train.py", cwd=tmp_path,
              extra_env={"STEPS": "400", "SLEEP": "0"}, preexec=ignore_sigxfsz_and_limit(64 * 1024))
    assert done.returncode == 0, done.stderr
    run = only_run_dir(tmp_path / "runs")
    m = _assert_honest(run)
    assert m["steps_seen"] == 400
    (steps,) = collected(m, "steps")
    assert steps["ok"] and steps["partial"], steps
    assert "File too large" in steps["reason"] and _lines(run / "steps.jsonl") < 400
    (prof,) = collected(m, "torch.profiler")
    assert not prof["ok"] and "File too large" in prof["reason"], prof
    errors = {e["path"]: e for e in m["write_errors"]}
    assert "steps.jsonl" in errors and "File too large" in errors["steps.jsonl"]["error"]
    (trace_error,) = [e for p, e in errors.items() if p.endswith(".pt.trace.json")]
    assert "File too large" in trace_error["error"]
    assert trace_error["kept"].endswith(".pt.trace.json.incomplete")  # nothing deleted: kept, named
    assert (run / trace_error["kept"]).is_file()
    lines = [ln for ln in gd_lines(done.stderr) if "could not be written" in ln]
    assert len(lines) == 1 and "File too large" in lines[0], done.stderr
    report = gd("analyze", run, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "File too large" in report.stdout


# --------------------------------------------------------------------------- the parent's gzip fails: the plain trace stays, listed


def test_a_trace_that_cannot_be_gzipped_stays_uncompressed_and_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.collect import ProfileOptions, profile_run, rundir, tracefilter

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rundir, "gzip_file", full)
    monkeypatch.setattr(tracefilter, "filter_trace", full)
    write_train(tmp_path)
    opts = ProfileOptions(script=str(tmp_path / "train.py"), out_dir=tmp_path / "runs", skip_first=2, warmup=1,
                          active=3, repeat=1, summary=False)
    result = profile_run(opts)
    run = result.run_dir
    m = _assert_honest(run)
    (trace,) = m["traces"]
    assert trace.endswith(".pt.trace.json") and _readable_trace(run / trace)
    (prof,) = collected(m, "torch.profiler")
    assert prof["ok"] and "uncompressed" in (prof["reason"] + prof["detail"]), prof
    (err,) = m["write_errors"]
    assert err["path"].endswith(".pt.trace.json.gz") and "No space left on device" in err["error"]
    assert err["kept"] == trace
    assert not list(run.glob("*.gz*"))
    done = gd("analyze", run, "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["run"]["metrics"], "the plain trace was not analyzed"


def test_a_gzip_that_does_not_verify_keeps_the_plain_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudoctor.collect import rundir

    plain = tmp_path / "w.00000002.pt.trace.json"
    plain.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))

    def torn(src: Path, dst: Path, level: int = 1) -> None:
        dst.write_bytes(gzip.compress(src.read_bytes())[:-12])  # a gzip cut short: its CRC never checks

    monkeypatch.setattr(rundir, "gzip_file", torn)
    outcomes: dict = {}
    assert rundir.compress_traces(tmp_path, [plain.name + ".gz"], outcomes) == []
    assert plain.is_file() and not (tmp_path / (plain.name + ".gz")).exists()
    assert "gzip" in str(outcomes[plain.name + ".gz"]).lower()


# --------------------------------------------------------------------------- a full disk (a small tmpfs): root only


@pytest.mark.parametrize("size", ["150k", "400k", "900k"])
def test_a_full_disk_leaves_an_honest_run_directory(size: str, tmp_path: Path) -> None:
    write_train(tmp_path)
    with small_filesystem(tmp_path / "small", size) as out:
        done = gd("profile", "--out", out, *WINDOW, "--no-report", "train.py", cwd=tmp_path,
                  extra_env={"STEPS": "300", "SLEEP": "0"})
        if done.returncode == 2:  # not even the run directory fits: said in one line, nothing run
            assert "No space left on device" in done.stderr and "Traceback" not in done.stderr
            runs = list(Path(out).iterdir()) if Path(out).is_dir() else []
            assert all((r / "manifest.json").is_file() for r in runs), runs  # never an empty run directory
            return
        assert done.returncode == 0, done.stderr
        run = only_run_dir(out)
        m = _assert_honest(run)
        if m["write_errors"]:
            assert all("No space left on device" in e["error"] for e in m["write_errors"]), m["write_errors"]
            lines = [ln for ln in gd_lines(done.stderr) if "could not be written" in ln]
            assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr
        assert m["steps_seen"] == 300


# --------------------------------------------------------------------------- Kineto cannot rename its file


def test_a_newline_in_out_keeps_the_trace(tmp_path: Path) -> None:
    write_train(tmp_path)
    done = gd("profile", "--out", "ru\nns", *WINDOW, "--no-report", "train.py", cwd=tmp_path, extra_env={"STEPS": "10"})
    assert done.returncode == 0, done.stderr
    run = only_run_dir(tmp_path / "ru\nns")
    m = _assert_honest(run)
    (trace,) = m["traces"]
    assert _readable_trace(run / trace)
    (prof,) = collected(m, "torch.profiler")
    assert prof["ok"]

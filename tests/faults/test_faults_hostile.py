"""Hostile or damaged input: manifest paths, manifest types, FIFOs, control characters, the compare gate."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from faultlib import WINDOW, gd, gd_lines, only_run_dir, write_train

from gpudoctor.errors import GpudoctorError
from gpudoctor.view import find_traces

pytestmark = pytest.mark.slow

HOSTILE_TRACES = ["/etc/passwd", "../../../../etc/shadow"]


def _edit_manifest(run: Path, **changes: object) -> None:
    m = json.loads((run / "manifest.json").read_text())
    m.update(changes)
    (run / "manifest.json").write_text(json.dumps(m))


def _one_error(stderr: str) -> str:
    lines = gd_lines(stderr)
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


# --------------------------------------------------------------------------- manifest paths stay in the run directory


@pytest.mark.parametrize("bad", HOSTILE_TRACES)
def test_view_refuses_a_manifest_path_outside_the_run(run_copy: Path, bad: str) -> None:
    _edit_manifest(run_copy, traces=[bad])
    with pytest.raises(GpudoctorError, match="outside the run directory"):
        find_traces(run_copy)


@pytest.mark.parametrize("command", ["analyze", "report", "view"])
def test_commands_refuse_manifest_paths_outside_the_run(command: str, run_copy: Path, tmp_path: Path) -> None:
    _edit_manifest(run_copy, traces=HOSTILE_TRACES)
    done = gd(command, run_copy, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    line = _one_error(done.stderr)
    assert "outside the run directory" in line and "traces" in line, line
    assert "root:" not in done.stdout  # nothing of /etc/passwd shown


def test_a_symlink_out_of_the_run_is_refused(run_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.pt.trace.json"
    outside.write_text('{"traceEvents": []}')
    (run_copy / "link.pt.trace.json").symlink_to(outside)
    _edit_manifest(run_copy, traces=["link.pt.trace.json"])
    for command in ("analyze", "view"):
        done = gd(command, run_copy, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, done.stderr
        assert "outside the run directory" in _one_error(done.stderr)


def test_rank_end_traces_outside_the_run_are_refused(run_copy: Path, tmp_path: Path) -> None:
    _edit_manifest(run_copy, rank_ends=[{"rank": 0, "traces": ["../../etc/passwd"]}])
    done = gd("analyze", run_copy, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "rank_ends" in _one_error(done.stderr)


# --------------------------------------------------------------------------- manifest fields are type-checked


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"traces": 42}, "traces"),
        ({"traces": "abc"}, "traces"),
        ({"traces": [1, 2]}, "traces"),
        ({"status": "exploded"}, "status"),
        ({"steps_seen": "many"}, "steps_seen"),
        ({"collected": [{"name": "steps", "ok": "yes"}]}, "collected"),
        ({"exit_code": True}, "exit_code"),
    ],
)
@pytest.mark.parametrize("command", ["analyze", "view"])
def test_a_mistyped_manifest_field_is_named(command: str, changes: dict, field: str, run_copy: Path, tmp_path: Path) -> None:
    _edit_manifest(run_copy, **changes)
    done = gd(command, run_copy, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    line = _one_error(done.stderr)
    assert f"'{field}" in line or f"{field}" in line.split("manifest.json", 1)[-1], line
    assert "internal error" not in line


# --------------------------------------------------------------------------- FIFOs and devices are refused before any read


@pytest.mark.parametrize(
    ("command", "name"),
    [("analyze", "t.json"), ("report", "t.json.gz"), ("check", "train.py"), ("view", "t.pt.trace.json")],
)
def test_a_fifo_argument_is_refused_at_once(command: str, name: str, tmp_path: Path) -> None:
    fifo = tmp_path / name
    os.mkfifo(fifo)
    done = gd(command, fifo, cwd=tmp_path, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in _one_error(done.stderr)


def test_profile_refuses_a_fifo_script_at_once(tmp_path: Path) -> None:
    """`profile FIFO.py` hung: the interpreter blocked reading a pipe no one writes."""
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    done = gd("profile", "--out", "runs", fifo, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "is a FIFO (named pipe), not a file" in _one_error(done.stderr)
    assert not (tmp_path / "runs").exists()


def test_compare_refuses_a_fifo(run_copy: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "b.json"
    os.mkfifo(fifo)
    done = gd("compare", run_copy, fifo, cwd=tmp_path, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in _one_error(done.stderr)


def test_a_device_is_refused(tmp_path: Path) -> None:
    done = gd("analyze", "/dev/zero", cwd=tmp_path, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in _one_error(done.stderr)


def test_fifos_inside_a_run_directory_are_not_read(run_copy: Path, tmp_path: Path) -> None:
    for p in run_copy.glob("*.pt.trace.json.gz"):
        p.unlink()
    _edit_manifest(run_copy, traces=[])
    os.mkfifo(run_copy / "host_1.pt.trace.json.gz")
    (run_copy / "steps.jsonl").unlink()
    os.mkfifo(run_copy / "steps.jsonl")
    done = gd("analyze", run_copy, cwd=tmp_path, timeout=30)
    assert done.returncode in (0, 2), done.stderr
    assert "Traceback" not in done.stderr


def test_a_folder_of_traces_with_a_fifo_is_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    os.mkfifo(folder / "rank0.json")
    done = gd("analyze", folder, cwd=tmp_path, timeout=30)
    assert done.returncode == 2, done.stderr
    assert "not a regular file" in _one_error(done.stderr)


# --------------------------------------------------------------------------- control characters on gpudoctor's own lines

RAW = ("\x1b", "\x07", "\x9b")


def _clean_lines(stderr: str) -> None:
    for line in gd_lines(stderr):
        assert not any(c in line for c in RAW), repr(line)


def test_a_scripts_exception_message_is_escaped_on_gpudoctors_lines(tmp_path: Path) -> None:
    write_train(tmp_path)
    done = gd("profile", "--out", "runs", *WINDOW, "--no-report", "train.py", cwd=tmp_path,
              extra_env={"RAISE": "\x1b[2J\x1b[31mboom\x07", "STEPS": "4"})
    assert done.returncode == 1
    assert "\x1b[2J" in done.stderr  # the script's own traceback passes through untouched
    assert any("\\x1b[31mboom\\x07" in ln for ln in gd_lines(done.stderr)), done.stderr
    _clean_lines(done.stderr)


def test_a_trace_file_name_is_escaped_in_errors(tmp_path: Path) -> None:
    bad = tmp_path / "evil\x1b]0;owned\x07.json"
    bad.write_text("{ not json")
    done = gd("analyze", bad, cwd=tmp_path, timeout=30)
    assert done.returncode == 2
    _clean_lines(done.stderr)
    assert "\\x1b]0;owned\\x07" in done.stderr


def test_a_check_file_name_is_escaped_in_warnings(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import torch\n")
    (tmp_path / "bad\x1b[31m.py").write_text("def (:\n")
    done = gd("check", tmp_path, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    _clean_lines(done.stderr)


def test_an_out_folder_name_is_escaped_in_the_summary(tmp_path: Path) -> None:
    write_train(tmp_path)
    done = gd("profile", "--out", "r\x1b[31muns", *WINDOW, "--no-report", "train.py", cwd=tmp_path,
              extra_env={"STEPS": "4"})
    assert done.returncode == 0, done.stderr
    _clean_lines(done.stderr)


# --------------------------------------------------------------------------- compare's gate never says "regression" when it cannot tell


def _steps_run(root: Path, name: str, walls_ms: list[float], profiled_run: Path) -> Path:
    run = root / name
    run.mkdir()
    m = json.loads((profiled_run / "manifest.json").read_text())
    m.update(run_id=name, traces=[], rank_ends=[])
    (run / "manifest.json").write_text(json.dumps(m))
    t = 0
    lines = []
    for i, w in enumerate(walls_ms):
        ns = int(w * 1e6)
        lines.append(json.dumps({"index": i, "start_ns": t, "wall_ns": ns, "data_wait_ns": 0}))
        t += ns
    (run / "steps.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_compare_gate_with_too_few_steps_never_exits_1(profiled_run: Path, tmp_path: Path) -> None:
    a = _steps_run(tmp_path, "a", [10, 10, 10], profiled_run)
    b = _steps_run(tmp_path, "b", [20, 20, 20], profiled_run)
    done = gd("compare", a, b, "--fail-on-regression", "5", cwd=tmp_path, timeout=60)
    assert done.returncode in (0, 2), (done.returncode, done.stderr)
    assert "too few steps" in done.stderr.lower() or "cannot" in done.stderr.lower(), done.stderr


def test_compare_gate_within_noise_exits_0_with_a_warning(profiled_run: Path, tmp_path: Path) -> None:
    rng = random.Random(7)
    walls_a = [rng.uniform(2, 40) for _ in range(12)]
    walls_b = [w * 1.12 for w in rng.sample(walls_a, len(walls_a))]
    a = _steps_run(tmp_path, "a", walls_a, profiled_run)
    b = _steps_run(tmp_path, "b", walls_b, profiled_run)
    done = gd("compare", a, b, "--fail-on-regression", "5", "--format", "json", cwd=tmp_path, timeout=60)
    verdict = json.loads(done.stdout)["step_time"]["verdict"]
    assert verdict == "within_noise", verdict
    assert done.returncode == 0, done.stderr
    assert any("warning" in ln and "noise" in ln for ln in gd_lines(done.stderr)), done.stderr


def test_compare_gate_still_fails_a_real_regression(profiled_run: Path, tmp_path: Path) -> None:
    a = _steps_run(tmp_path, "a", [10.0 + 0.01 * i for i in range(30)], profiled_run)
    b = _steps_run(tmp_path, "b", [20.0 + 0.01 * i for i in range(30)], profiled_run)
    done = gd("compare", a, b, "--fail-on-regression", "5", cwd=tmp_path, timeout=60)
    assert done.returncode == 1, done.stderr


def test_the_profiled_fixture_is_whole(profiled_run: Path) -> None:
    m = json.loads((profiled_run / "manifest.json").read_text())
    assert m["status"] == "completed" and len(m["traces"]) == 1
    assert only_run_dir(profiled_run.parent) == profiled_run

"""`gpudoctor profile` refuses bad input with one line and exit 2, and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from collect_testlib import env, run_profile

from gpudoctor.collect.options import ProfileOptions, validate
from gpudoctor.errors import UsageError


def _refused(tmp_path, *args: str) -> str:
    out = tmp_path / "runs"
    proc = run_profile("--no-report", "--out", str(out), *args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpudoctor: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists() or not any(out.iterdir())
    return lines[0]


def test_missing_script(tmp_path):
    assert "no such file" in _refused(tmp_path, "nope.py")


def test_a_directory(tmp_path):
    (tmp_path / "proj").mkdir()
    assert "is a directory" in _refused(tmp_path, "proj")


def test_a_file_that_is_not_python(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n1,2\n")
    assert "not a Python script" in _refused(tmp_path, "data.csv")
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02torch")
    assert "not a Python script" in _refused(tmp_path, "blob.bin")


def test_unknown_option(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    msg = _refused(tmp_path, "--bogus", "train.py")
    assert "--bogus" in msg


def test_unknown_module(tmp_path):
    assert "no module named" in _refused(tmp_path, "-m", "surely_not_a_module_xyz.train")


def test_bad_distributed_options_are_refused(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    assert "--rdzv-endpoint HOST:PORT" in _refused(tmp_path, "--nproc-per-node", "2", "--nnodes", "2", "train.py")
    assert "go with --nproc-per-node" in _refused(tmp_path, "--master-port", "29500", "train.py")


def test_validate_accepts_python_without_suffix_and_modules(tmp_path):
    script = tmp_path / "train"
    script.write_text("#!/usr/bin/env python\nprint('hi')\n")
    t = validate(ProfileOptions(script="train", args=("--x",)), cwd=str(tmp_path))
    assert t.script_path == str(script) and t.argv == ("train", "--x")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "run.py").write_text("print('hi')\n")
    m = validate(ProfileOptions(module="pkg.run", args=("a",)), cwd=str(tmp_path))
    assert m.module_origin == str(tmp_path / "pkg" / "run.py") and m.argv == (m.module_origin, "a")
    with pytest.raises(UsageError):
        validate(ProfileOptions(script="train", module="pkg.run"), cwd=str(tmp_path))
    with pytest.raises(UsageError):
        validate(ProfileOptions(), cwd=str(tmp_path))


def test_help_shows_the_schedule_options():
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--help"], env=env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for opt in ("--skip-first", "--wait", "--warmup", "--active", "--repeat", "--steps", "--no-report"):
        assert opt in text
    defaults = ProfileOptions()
    assert f"--skip-first INTEGER RANGE Steps run before the first profiled window (it starts right after). [default: {defaults.skip_first}" in text
    assert f"[default: {defaults.wait}" in text and f"[default: {defaults.active}" in text


def test_the_parent_never_imports_torch():
    code = "import sys, gpudoctor.cli, gpudoctor.collect; import gpudoctor.collect.runner; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


# --------------------------------------------------------------------------- the script's arguments


def _parsed(*args: str) -> dict:
    """What `gpudoctor profile ARGS` hands the command (click parses; nothing runs)."""
    from gpudoctor.cli import cli

    ctx = cli.commands["profile"].make_context("profile", list(args))
    return ctx.params


@pytest.mark.parametrize(("args", "script", "module", "script_args", "steps"), [
    (("train.py", "--epochs", "1"), "train.py", None, ("--epochs", "1"), None),
    (("--steps", "40", "train.py", "--lr", "3"), "train.py", None, ("--lr", "3"), 40),
    (("train.py", "--steps", "3"), "train.py", None, ("--steps", "3"), None),  # the script's own --steps
    (("train.py", "--", "--epochs", "1"), "train.py", None, ("--epochs", "1"), None),  # the older separator
    (("--steps", "5", "--", "train.py", "--x"), "train.py", None, ("--x",), 5),
    (("train.py", "--", "--", "a"), "train.py", None, ("--", "a"), None),  # only the first `--` is gpudoctor's
    (("--out", "-m", "train.py", "-m"), "train.py", None, ("-m",), None),  # an option's value is not an option
    (("--out=runs", "--no-cprofile", "train.py", "-o", "x"), "train.py", None, ("-o", "x"), None),
    (("-m", "pkg.train", "--epochs", "1"), None, "pkg.train", ("--epochs", "1"), None),
    (("-mpkg.train", "--", "--lr", "3"), None, "pkg.train", ("--lr", "3"), None),
])
def test_what_follows_the_script_is_the_scripts(args, script, module, script_args, steps):
    p = _parsed(*args)
    if p["module"]:  # with -m, click's SCRIPT is the module's first argument (the command puts it back)
        p["script_args"] = (p.pop("script"), *p["script_args"]) if p["script"] else p["script_args"]
        p["script"] = None
    assert (p["script"], p["module"], p["script_args"], p["steps"]) == (script, module, script_args, steps)


def test_gpudoctor_options_after_the_script_are_not_gpudoctors():
    p = _parsed("--format", "json", "-o", "r.json", "train.py", "--format", "md", "-o", "y")
    assert (p["fmt"], p["output"], p["script_args"]) == ("json", "r.json", ("--format", "md", "-o", "y"))


def test_the_script_receives_what_follows_it(tmp_path):
    """`gpudoctor profile train.py --epochs 1` runs the script with `--epochs 1`, as python would
    (before, click refused it: "No such option '--epochs'. Did you mean '--steps'?")."""
    (tmp_path / "train.py").write_text(
        "import json, sys\nopen('argv.json', 'w').write(json.dumps(sys.argv[1:]))\n")
    proc = run_profile("--no-report", "--out", "runs", "--time-window", "off", "train.py", "--epochs", "1",
                       "--steps", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "argv.json").read_text()) == ["--epochs", "1", "--steps", "2"]
    (run,) = (tmp_path / "runs").iterdir()
    m = json.loads((run / "manifest.json").read_text())
    assert m["argv"][1:] == ["--epochs", "1", "--steps", "2"]

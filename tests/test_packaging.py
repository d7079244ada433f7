"""The install fits the user's environment, and the command line follows the conventions.

torch is the user's (a CUDA build must not be replaced by pip), TensorBoard is the `view`
extra; bare `gpudoctor` prints its help; NO_COLOR / FORCE_COLOR; hints name real commands;
a missing torch or TensorBoard is a one-line error that says what to install.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpudoctor.cli import cli, use_color

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_scripts" / "starved_dataloader.py"


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].strip().lower()


def test_pyproject_declares_neither_torch_nor_tensorboard():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    deps = {_name(r) for r in project["dependencies"]}
    assert not deps & {"torch", "tensorboard", "torch-tb-profiler"}, deps
    extras = project["optional-dependencies"]
    view = {_name(r) for r in extras["view"]}
    assert view == {"tensorboard", "torch-tb-profiler"}
    assert view <= {_name(r) for r in extras["test"]}  # the README's test command installs .[test] only
    assert project["license"] == "Apache-2.0" and (ROOT / project["license-files"][0]).is_file()
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8")[:200]
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in project["classifiers"])
    assert project["keywords"] and project["authors"] and project["requires-python"]


def _gpudoctor(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpudoctor", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, cwd=cwd)


def test_bare_gpudoctor_prints_the_help_and_exits_0():
    proc = _gpudoctor()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: gpudoctor") and "profile" in proc.stdout and proc.stderr == ""


def test_usage_errors_point_at_a_help_that_exists():
    top = _gpudoctor("--bogus")
    assert top.returncode == 2 and top.stderr.strip().endswith("(see gpudoctor --help)")
    sub = _gpudoctor("profile", "--bogus")
    assert sub.returncode == 2 and sub.stderr.strip().endswith("(see gpudoctor profile --help)")


def test_hints_in_the_package_name_real_commands():
    commands = set(cli.commands)
    pattern = re.compile(r"(?:`|see |run |\")gpudoctor ([a-z][a-z_-]*)")
    wrong = []
    for path in (ROOT / "gpudoctor").rglob("*.py"):
        for word in pattern.findall(path.read_text(encoding="utf-8")):
            if word not in commands and word != "could":  # "gpudoctor could …": prose, not a command
                wrong.append(f"{path.relative_to(ROOT)}: gpudoctor {word}")
    assert not wrong, wrong


@pytest.mark.parametrize(("env", "tty", "expected"), [
    ({}, True, True),
    ({}, False, False),
    ({"NO_COLOR": "1"}, True, False),
    ({"NO_COLOR": ""}, True, True),  # empty: not set (no-color.org)
    ({"FORCE_COLOR": "1"}, False, True),
    ({"FORCE_COLOR": ""}, False, False),
    ({"FORCE_COLOR": "1", "NO_COLOR": "1"}, True, False),  # the user's "no" wins
])
def test_color_follows_no_color_and_force_color(env, tty, expected):
    assert use_color(env, tty) is expected


def test_force_color_colours_a_pipe_and_no_color_wins():
    def out(**env: str) -> str:
        return _gpudoctor("check", str(SAMPLE), env={"NO_COLOR": "", "FORCE_COLOR": "", **env}).stdout

    assert "\x1b[" not in out() and "\x1b[" in out(FORCE_COLOR="1")
    assert "\x1b[" not in out(FORCE_COLOR="1", NO_COLOR="1")


def _blocker(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import ``modules`` (a sitecustomize finder refuses them)."""
    site = tmp_path / "block"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(f"""\
        import sys

        class _Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {set(modules)!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, _Refuse())
        """))
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def test_profile_without_torch_says_how_to_install_it(tmp_path):
    proc = _gpudoctor("profile", str(SAMPLE), env=_blocker(tmp_path, "torch"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cannot import torch" in proc.stderr and "pip install torch" in proc.stderr
    assert not (tmp_path / "gpudoctor-runs").exists()  # nothing created for a run that cannot start


def test_check_and_analyze_run_without_torch(tmp_path):
    env = _blocker(tmp_path, "torch")
    proc = _gpudoctor("check", str(SAMPLE), env=env)
    assert proc.returncode in (0, 1) and "GD201" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr


def test_view_without_the_extra_names_it(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "host_1.00000010.pt.trace.json").write_text('{"traceEvents": []}')
    proc = _gpudoctor("view", str(run), env=_blocker(tmp_path, "tensorboard", "torch_tb_profiler"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and 'pip install "gpudoctor[view]"' in proc.stderr

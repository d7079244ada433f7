"""The shipped .pre-commit-hooks.yaml run by pre-commit itself on a temporary git repository.

pre-commit installs a `language: python` hook by `pip install`-ing the repository into an
environment of its own, which needs the package index (gpudoctor's dependencies): the test
runs offline, so it runs each shipped hook as a `repo: local` hook of `language: system` with
the shipped entry, types and options (the gpudoctor of this environment). What it tests is the
hook's definition (entry, arguments, file selection) under the real pre-commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

pytestmark = pytest.mark.slow


def _hooks() -> dict[str, dict]:
    import yaml

    return {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    pytest.importorskip("pre_commit")
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    env = {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "cache"), "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    work = tmp_path / "project"
    work.mkdir()
    _run(["git", "init", "-q"], work, env)
    return work, env


def _config(work: Path, hook_id: str) -> None:
    import yaml

    hook = dict(_hooks()[hook_id])
    hook["language"] = "system"  # offline: this environment's gpudoctor (see the module's docstring)
    (work / ".pre-commit-config.yaml").write_text(yaml.safe_dump({"repos": [{"repo": "local", "hooks": [hook]}]}),
                                                  encoding="utf-8")


def test_the_shipped_hooks_are_well_formed() -> None:
    pytest.importorskip("pre_commit")
    hooks = _hooks()
    assert set(hooks) == {"gpudoctor-check", "gpudoctor-check-fix"}
    assert hooks["gpudoctor-check"]["entry"].startswith("gpudoctor check")
    assert "--fix" in hooks["gpudoctor-check-fix"]["entry"] and "--exit-non-zero-on-fix" in hooks["gpudoctor-check-fix"]["entry"]
    for h in hooks.values():
        assert h["language"] == "python" and h["types"] == ["python"]


def test_gpudoctor_check_hook_fails_a_commit_with_a_warning(repo) -> None:
    work, env = repo
    _config(work, "gpudoctor-check")
    shutil.copyfile(SCRIPTS / "eval_loop.py", work / "eval_loop.py")  # GD701: a warning
    _run(["git", "add", "-A"], work, env)
    result = _run([sys.executable, "-m", "pre_commit", "run", "--all-files"], work, env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "GD701" in result.stdout and "Failed" in result.stdout
    (work / "eval_loop.py").unlink()
    shutil.copyfile(SCRIPTS / "cudnn_off.py", work / "cudnn_off.py")  # GD403, GD401: info only
    _run(["git", "add", "-A"], work, env)
    result = _run([sys.executable, "-m", "pre_commit", "run", "--all-files"], work, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Passed" in result.stdout


def test_gpudoctor_check_fix_hook_fixes_and_fails_once(repo) -> None:
    work, env = repo
    _config(work, "gpudoctor-check-fix")
    shutil.copyfile(SCRIPTS / "optimizers.py", work / "optimizers.py")
    _run(["git", "add", "-A"], work, env)
    first = _run([sys.executable, "-m", "pre_commit", "run", "--all-files"], work, env)
    assert first.returncode == 1, first.stdout + first.stderr
    assert "fused=True)" in (work / "optimizers.py").read_text(encoding="utf-8")
    assert "optimizers.py: fixed 1 (GD404 line 12)" in first.stdout
    _run(["git", "add", "-A"], work, env)
    second = _run([sys.executable, "-m", "pre_commit", "run", "--all-files"], work, env)
    assert second.returncode == 0, second.stdout + second.stderr

"""Helpers of the fault suite: run the real CLI in a subprocess under hostile plumbing.

Every helper starts ``python -m gpudoctor`` with this checkout first on ``PYTHONPATH``,
so the code under test is this worktree's whatever is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# A training script with a knob for every fault: steps, sleep, exit code, a message to raise.
TRAIN = '''
import os, sys, time, torch
m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
steps = int(os.environ.get("STEPS", "30"))
for i in range(steps):
    opt.zero_grad(); m(torch.randn(8, 16)).sum().backward(); opt.step()
    time.sleep(float(os.environ.get("SLEEP", "0.005")))
    if os.environ.get("MARK"):
        open(os.environ["MARK"], "a").write(f"{i}\\n")
if os.environ.get("RAISE"):
    raise RuntimeError(os.environ["RAISE"])
if os.environ.get("PRINT"):
    print(os.environ["PRINT"])
sys.exit(int(os.environ.get("EXIT_CODE", "0")))
'''

# the profiler window every run of the suite records: small, early
WINDOW = ("--skip-first", "2", "--warmup", "1", "--active", "3", "--repeat", "1")


def env(**extra: str) -> dict[str, str]:
    e = os.environ.copy()
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("OMP_NUM_THREADS", "1")
    e.pop("GPUDOCTOR_DEBUG", None)
    e.update(extra)
    return e


def gd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpudoctor", *[str(a) for a in args]]


def gd(*args: Any, cwd: Path, timeout: float = 180, extra_env: dict[str, str] | None = None,
       preexec: Callable[[], None] | None = None, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """Run ``gpudoctor ARGS``: stdout and stderr captured."""
    return subprocess.run(gd_cmd(*args), cwd=cwd, env=env(**(extra_env or {})), capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec, stdin=stdin)


def gd_reader_gone(*args: Any, cwd: Path, timeout: float = 180, extra_env: dict[str, str] | None = None) -> tuple[int, str]:
    """``gpudoctor ARGS | true``, deterministically: the pipe's reading end is closed before anything is written."""
    proc = subprocess.Popen(gd_cmd(*args), cwd=cwd, env=env(**(extra_env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode("utf-8", "replace")
        return proc.wait(timeout=timeout), err
    finally:
        if proc.poll() is None:
            proc.kill()


def close_stdout() -> None:
    """preexec_fn: ``>&-``."""
    os.close(1)


def close_stderr() -> None:
    os.close(2)


def ignore_sigxfsz_and_limit(n_bytes: int) -> Callable[[], None]:
    """preexec_fn: files may not grow past ``n_bytes`` (EFBIG instead of the SIGXFSZ kill)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, n_bytes))

    return apply


def write_train(folder: Path, name: str = "train.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(TRAIN)
    return path


def only_run_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def manifest(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "manifest.json").read_text())


def collected(m: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [c for c in m["collected"] if c["name"] == name]


def gd_lines(stderr: str) -> list[str]:
    """gpudoctor's own lines on stderr (the script's output aside)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("gpudoctor")]


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# --------------------------------------------------------------------------- start-up moments

HOOK_ENV = "GPUDOCTOR_STARTUP_HOOK"  # gpudoctor.signals.STARTUP_HOOK_ENV


def start_paused(points: str, *args: Any, cwd: Path, hooks: Path, **extra: str) -> subprocess.Popen[str]:
    """``gpudoctor ARGS`` that stops at the named start-up point(s) (``gpudoctor.signals.POINTS``,
    comma-separated), writes ``hooks/POINT`` and waits there for a signal: the test sends it at
    exactly that moment. In its own process group: what reaches it is only what the test sends."""
    hooks.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(gd_cmd(*args), cwd=cwd, env=env(**{HOOK_ENV: f"{points}:{hooks}"}, **extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def wait_paused(proc: subprocess.Popen[str], hooks: Path, point: str, timeout: float = 120) -> None:
    """Until gpudoctor (or its training process) waits at ``point``."""

    def there() -> bool:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"gpudoctor ended (exit {proc.returncode}) before {point!r}: {err[-2000:]}")
        return (hooks / point).is_file()

    wait_for(there, timeout=timeout, what=f"start-up point {point!r}")


# --------------------------------------------------------------------------- file systems


def _mount_tmpfs(path: Path, size: str) -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (root on Linux only; the caller skips otherwise)."""
    if not _mount_tmpfs(path, size):
        import pytest

        pytest.skip("mounting a small tmpfs needs root on Linux")
    try:
        yield path
    finally:
        _umount(path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` (a folder, filled by the caller before) made read-only for real.

    As root, permissions do not stop a write: the folder's content is then moved onto a
    tmpfs remounted read-only (EROFS), the way a shared mount or an artifact store is.
    Otherwise ``chmod`` does it (EACCES).
    """
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
        for p in modes:
            p.chmod(modes[p] & ~0o222)
        try:
            yield path
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    keep = path.with_name(path.name + ".orig")
    path.rename(keep)
    if not _mount_tmpfs(path, "64m"):
        keep.rename(path)
        import pytest

        pytest.skip("cannot mount a tmpfs to make a read-only folder")
    try:
        for p in keep.iterdir():
            if p.is_dir():
                shutil.copytree(p, path / p.name)
            else:
                shutil.copy2(p, path / p.name)
        subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)
        yield path
    finally:
        _umount(path)
        shutil.rmtree(path, ignore_errors=True)
        keep.rename(path)

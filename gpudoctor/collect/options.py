"""What ``gpudoctor profile`` was asked to do, and the checks made before anything is created."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.errors import UsageError
from gpudoctor.safe import not_regular

if TYPE_CHECKING:  # gpudoctor.model takes ~0.1 s to import: the parent loads it after the launch
    from gpudoctor.model import Injection, Manifest, ProfilerSchedule

# Defaults shared by the CLI and the API (measured in benchmarks/overhead.py; see
# docs/run-directory.md "Overhead").
DEFAULT_SKIP_FIRST = 10
DEFAULT_WAIT = 294
DEFAULT_WARMUP = 1
DEFAULT_ACTIVE = 5
DEFAULT_REPEAT = 3
DEFAULT_CPROFILE_STEPS = 20
DEFAULT_DETAIL_WINDOWS = 1
DEFAULT_SAMPLE_INTERVAL_MS = 200
# seconds of the script recorded when nothing marks steps (collect/timewindow.py)
DEFAULT_TIME_WINDOW_S = (5.0, 10.0)


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    script: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    out_dir: Path = Path("gpudoctor-runs")
    max_steps: int | None = None  # --steps N: stop cleanly after N steps
    skip_first: int = DEFAULT_SKIP_FIRST
    wait: int = DEFAULT_WAIT
    warmup: int = DEFAULT_WARMUP
    active: int = DEFAULT_ACTIVE
    repeat: int = DEFAULT_REPEAT
    record_shapes: bool = True
    with_stack: bool = True
    profile_memory: bool = False
    cprofile: bool = True
    sample_interval_ms: int = DEFAULT_SAMPLE_INTERVAL_MS
    nproc_per_node: int | None = None
    nnodes: str | None = None
    node_rank: int | None = None
    rdzv_endpoint: str | None = None
    master_port: int | None = None
    cprofile_steps: int = DEFAULT_CPROFILE_STEPS  # longest cProfile window, in steps
    # windows that record shapes / stacks / memory (the first N); later ones record timings only
    detail_windows: int = DEFAULT_DETAIL_WINDOWS
    # seconds (from, to) of the script recorded when nothing marks steps; None: never
    time_window_s: tuple[float, float] | None = DEFAULT_TIME_WINDOW_S
    command: tuple[str, ...] | None = None  # what the user typed (manifest.command); None: derived
    summary: bool = True  # print the closing summary to stderr
    progress: bool = False  # the progress line on stderr while the script runs (on a terminal only)
    # --verify trials (gpudoctor.verify): step timing only, a fix injected, the script's output to a file
    torch_profiler: bool = True  # False: no torch.profiler window at all (the schedule is not used)
    injections: tuple[Injection, ...] = ()  # changes applied to the run without editing the script
    run_dir: Path | None = None  # create exactly this run directory instead of one under out_dir
    output_log: bool = False  # the script's stdout and stderr go to output.log in the run directory
    cwd: str | None = None  # the folder the script runs in (default: the current one)
    timeout_s: float | None = None  # SIGTERM the script after this long (then SIGKILL 10 s later)
    # record the finished run as this user's (gpudoctor.trust: verify runs it again without asking);
    # verify's own trials are not recorded (each would leave a record)
    record_trust: bool = True

    def schedule_fields(self) -> dict[str, Any]:
        """The ``ProfilerSchedule`` fields, as the child receives them."""
        return {
            "skip_first": self.skip_first,
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
            "repeat": self.repeat,
            "record_shapes": self.record_shapes,
            "with_stack": self.with_stack,
            "profile_memory": self.profile_memory,
            "detail_windows": self.detail_windows,
        }

    def schedule(self) -> ProfilerSchedule:
        from gpudoctor.model import ProfilerSchedule

        return ProfilerSchedule(**self.schedule_fields())


@dataclass(frozen=True, slots=True)
class ProfileResult:
    run_dir: Path
    exit_code: int
    manifest: Manifest
    # SIGINT, SIGTERM, SIGHUP that gpudoctor's own process received while the script ran (each passed
    # on to the script, or it got it too): a caller that runs the script again (--verify) stops on them
    signals: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Target:
    """The validated thing to run."""

    script_arg: str | None  # the script as the user typed it (sys.argv[0])
    script_path: str | None  # absolute path
    module: str | None
    module_origin: str | None  # file -m runs (sys.argv[0] under -m)
    argv: tuple[str, ...]


_PY_SUFFIXES = (".py", ".pyw")


def short_run_wait(max_steps: int | None, skip_first: int, warmup: int, active: int, repeat: int,
                   wait: int = DEFAULT_WAIT) -> int:
    """The steps between windows for a run of ``max_steps`` steps (``--steps N`` with ``--wait``
    left at its default): short enough that a second window, which records timings only, fits
    before the run stops. The first window records shapes and stacks, which slow its ops
    (Python-heavy steps ran 4x slower in it, measured on the samples): a short run judged from it
    alone took per-op overhead for op work. The steps between the windows keep cProfile's
    window (at least 2 steps); a run too short for that, or one that asked for one window,
    keeps ``wait``."""
    if max_steps is None or active <= 0 or repeat == 1:
        return wait
    cycle = warmup + active
    fitted = max_steps - skip_first - 2 * cycle
    if fitted >= wait or fitted < 2:
        return wait
    return fitted


def parse_time_window(text: str) -> tuple[float, float] | None:
    """``--time-window`` as typed: ``START:END`` seconds, or ``off``."""
    if text.strip().lower() in ("off", "none", "no"):
        return None
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        window = (float(start), float(end))
    except ValueError:
        raise UsageError(f"--time-window {text!r}: give START:END in seconds (e.g. 5:10), or 'off'") from None
    if not 0 <= window[0] < window[1]:
        raise UsageError(f"--time-window {text!r}: START must be at least 0 and END after it")
    return window


def _looks_like_python(path: Path) -> bool:
    """A file without a .py suffix: a Python shebang, or no suffix at all and source that compiles.

    A file with another suffix (data.csv, run.sh, notes.txt) is refused even when its
    text happens to compile (``a,b`` is a valid Python expression).
    """
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if b"\0" in data[:8192]:
        return False
    first = data.split(b"\n", 1)[0]
    if first.startswith(b"#!") and b"python" in first:
        return True
    if path.suffix:
        return False
    try:
        compile(data, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _find_module(name: str, cwd: str) -> str | None:
    """Where ``python -m name`` would find its code, without importing (running) anything."""
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    search: list[str] | None = [cwd, *[p for p in sys.path if p]]
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            # a top-level built-in or frozen module (rare as a training entry point)
            if i == 0:
                try:
                    spec = importlib.util.find_spec(part)
                except (ImportError, ValueError):
                    spec = None
            if spec is None:
                return None
        search = list(spec.submodule_search_locations or []) or None
        if i < len(parts) - 1 and search is None:
            return None
    assert spec is not None
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        main = importlib.machinery.PathFinder.find_spec("__main__", list(spec.submodule_search_locations))
        if main is None:
            return None
        return main.origin or ""
    return spec.origin or ""


TORCH_INSTALL_URL = "https://pytorch.org/get-started/locally/"


def require_torch() -> None:
    """torch is the user's (gpudoctor does not declare it, so that pip never replaces their build):
    the training process imports it, so it must be importable by this Python. Found without importing
    it (the parent never imports torch); a one-line ``UsageError`` saying how to install it when not."""
    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken install, or one blocked on purpose
        found = False
    if not found:
        raise UsageError(
            f"PyTorch is not installed in this Python ({sys.executable}): gpudoctor profile runs the script "
            f"with it; install the build for your machine (pip install torch, or see {TORCH_INSTALL_URL})"
        )


def validate(opts: ProfileOptions, cwd: str | None = None) -> Target:
    """Check the options before anything is created; raise ``UsageError`` with what to do."""
    cwd = cwd or os.getcwd()
    require_torch()
    if any(v is not None for v in (opts.nproc_per_node, opts.nnodes, opts.node_rank, opts.rdzv_endpoint, opts.master_port)):
        from gpudoctor.collect import distributed  # noqa: PLC0415

        distributed.validate(opts)
    if opts.max_steps is not None and opts.max_steps < 1:
        raise UsageError("--steps must be at least 1")
    if opts.active < 1:
        raise UsageError("--active must be at least 1")
    if min(opts.skip_first, opts.wait, opts.warmup, opts.repeat) < 0:
        raise UsageError("--skip-first, --wait, --warmup and --repeat cannot be negative")
    if opts.detail_windows < 0 or opts.cprofile_steps < 0:
        raise UsageError("detail_windows and cprofile_steps cannot be negative")
    if opts.time_window_s is not None:
        start, end = opts.time_window_s
        if not 0 <= start < end:
            raise UsageError("--time-window START:END needs 0 <= START < END seconds (e.g. 5:10), or 'off'")
    if opts.sample_interval_ms < 10:
        raise UsageError("--sample-interval-ms must be at least 10")
    if opts.module and opts.script:
        raise UsageError("give either a script or -m MODULE, not both")
    if opts.module:
        origin = _find_module(opts.module, cwd)
        if origin is None:
            raise UsageError(
                f"no module named {opts.module!r} (looked in the current directory and sys.path); "
                "check the name or run from the folder that contains the package"
            )
        return Target(None, None, opts.module, origin, (origin, *opts.args))
    if not opts.script:
        raise UsageError("give a script to profile: gpudoctor profile [OPTIONS] train.py ARGS (or -m module ARGS)")
    path = Path(opts.script)
    if not path.is_absolute():
        path = Path(cwd) / path
    if not path.exists():
        raise UsageError(f"{opts.script}: no such file; give the path of the training script")
    if path.is_dir():
        raise UsageError(
            f"{opts.script} is a directory; give the training script inside it "
            "(gpudoctor profile DIR/train.py) or run a package with -m"
        )
    kind = not_regular(path)
    if kind:  # a FIFO would block the interpreter's read forever, a device never end
        raise UsageError(f"{opts.script} is {kind}, not a file; give the path of the training script")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{opts.script}: permission denied; make the script readable")
    if path.suffix not in _PY_SUFFIXES and not _looks_like_python(path):
        hint = " (convert a notebook with: jupyter nbconvert --to script)" if path.suffix == ".ipynb" else ""
        raise UsageError(f"{opts.script} is not a Python script; give the .py file that trains the model{hint}")
    return Target(opts.script, os.path.abspath(path), None, None, (opts.script, *opts.args))

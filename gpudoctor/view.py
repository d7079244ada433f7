"""``gpudoctor view RUN``: the run's traces in TensorBoard's PyTorch profiler plugin.

TensorBoard is started as a child process on 127.0.0.1 (a free port unless one is
given) over a private log directory that holds exactly this run: one folder named
after the run with a link to each of its Kineto traces, named the way the
torch-tb-profiler plugin looks for them (``*.pt.trace.json[.gz]``), so a trace
written under another name (a colleague's ``rank0.json.gz``) is listed too. The
URL is printed once the plugin answers, with how to open the same traces in
Perfetto (https://ui.perfetto.dev, nothing to install). Before it, ``plugin_notes`` says what
the plugin loads from the web (Google Charts, a polyfill: without internet access its pages stay
blank, and gpudoctor's own HTML report is the offline view) and why its figures differ from
gpudoctor's (its DataLoader time counts only the ``enumerate(DataLoader)`` ops inside the
profiled steps), with the run's own data-wait figure from its ``report.json``. Ctrl-C, SIGTERM or SIGHUP
stops TensorBoard and removes the temporary folder, and ends gpudoctor as the signal
says (exit 130, 143, 129); the run directory is never written to.

The manifest is untrusted: its fields are type-checked and a trace it names must
resolve inside the run directory, or nothing is served. Only regular files are
linked (a FIFO or a device is refused).

Imports only ``gpudoctor.errors``, ``gpudoctor.safe``, ``gpudoctor.signals``, ``gpudoctor.model``
(the run directory's names: ``model.layout``) and the standard library;
TensorBoard runs as ``python -m tensorboard.main`` in its own session, so Ctrl-C
reaches gpudoctor alone, which then stops it cleanly. TensorBoard is told to stop
when gpudoctor's process dies (Linux: ``PR_SET_PDEATHSIG``), and the temporary
folder holds gpudoctor's pid: a ``view`` killed outright leaves a folder that the
next ``view`` removes.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import safe
from gpudoctor.errors import GpudoctorError, UsageError
from gpudoctor.model import Manifest, layout
from gpudoctor.model._serde import FieldTypeError, check
from gpudoctor.signals import Interrupted

PLUGIN_PATTERN = re.compile(r"^(.*?)(\.\d+)?" + re.escape(layout.PLAIN_TRACE_SUFFIX) + r"(?:\.gz)?$")
PLUGIN_NAME = "pytorch_profiler"
PERFETTO_URL = "https://ui.perfetto.dev"
START_TIMEOUT_S = 120.0
_SNIFF_BYTES = 4 << 20  # a Kineto trace names "traceEvents" near its start
_URL = re.compile(r"http://127\.0\.0\.1:(\d+)/")
TEMP_PREFIX = "gpudoctor-view-"
PID_FILE = "view.pid"  # in the temporary folder: the pid of the gpudoctor view that owns it


class TensorBoardError(GpudoctorError):
    """TensorBoard could not be started or stopped by itself."""


@dataclass(frozen=True)
class ViewTarget:
    name: str  # the run name TensorBoard shows
    traces: tuple[Path, ...]
    run_dir: Path | None = None  # a run directory of gpudoctor's (its report.json has gpudoctor's figures)


# --------------------------------------------------------------------------- finding the traces


def _is_trace_name(name: str) -> bool:
    return name.endswith((".json", ".json.gz"))


def looks_like_kineto(path: Path) -> bool:
    """Whether a (gzipped) JSON file starts like a Kineto trace (has "traceEvents" early on)."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as fh:
                head = fh.read(_SNIFF_BYTES)
        else:
            with path.open("rb") as fh:
                head = fh.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    return b'"traceEvents"' in head


def _manifest(run_dir: Path) -> dict | None:
    path = run_dir / layout.MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: not readable JSON ({err}); is {run_dir} a gpudoctor run directory?") from err
    if not isinstance(data, dict):
        return None
    try:
        check(Manifest, data, required=False)
    except FieldTypeError as err:
        raise UsageError(f"{path}: {err}; the manifest is damaged: re-run gpudoctor profile or pass a trace file") from None
    return data


def _refuse_special(path: Path) -> None:
    kind = safe.not_regular(path, dir_ok=True)
    if kind:
        raise UsageError(f"{path}: not a regular file ({kind}); pass a run directory (gpudoctor-runs/…) or a Kineto trace")


def find_traces(path: Path) -> ViewTarget:
    """The Kineto traces of a run directory, a folder of traces, or one trace file."""
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory; pass a run directory (gpudoctor-runs/…) or a Kineto trace")
    _refuse_special(path)
    if path.is_file():
        if not (_is_trace_name(path.name) and looks_like_kineto(path)):
            raise UsageError(f"{path} is not a Kineto trace (*.pt.trace.json[.gz]); pass a run directory or a trace file")
        m = PLUGIN_PATTERN.match(path.name)
        name = m.group(1) if m else re.sub(r"\.json(\.gz)?$", "", path.name)
        return ViewTarget(name or "trace", (path,))
    manifest = _manifest(path)
    traces: list[Path] = []
    if manifest is not None:
        for rel in manifest.get("traces") or ():
            p = safe.inside(path, rel)
            if p is None:
                raise UsageError(
                    f"{path / layout.MANIFEST}: field 'traces' names {rel}, outside the run directory; refusing to "
                    "serve it: re-run gpudoctor profile or pass the trace file itself"
                )
            if not safe.not_regular(p) and p.is_file() and p not in traces:
                traces.append(p)
    if not traces:
        traces = sorted(p for p in path.rglob("*") if PLUGIN_PATTERN.match(p.name) and _servable(path, p))
    if not traces and manifest is None:
        traces = sorted(p for p in path.iterdir() if _is_trace_name(p.name) and _servable(path, p) and looks_like_kineto(p))
    if not traces:
        if manifest is not None:
            why = ""
            for c in manifest.get("collected") or ():
                if isinstance(c, dict) and c.get("name") == "torch.profiler" and not c.get("ok", True):
                    why = f" (torch.profiler: {c.get('reason') or 'not collected'})"
            raise UsageError(
                f"{path} has no Kineto trace to show{why}; profile again with a window of steps "
                "(gpudoctor profile --skip-first/--active) or pass a trace file"
            )
        raise UsageError(
            f"{path} is not a run directory and holds no Kineto traces (*.pt.trace.json[.gz]); "
            "pass a run directory made by gpudoctor profile, or a trace file"
        )
    return ViewTarget(path.resolve().name or "run", tuple(traces), path if manifest is not None else None)


def _servable(folder: Path, p: Path) -> bool:
    """A regular file that stays inside ``folder`` once its symlinks are followed."""
    return not safe.not_regular(p) and p.is_file() and safe.inside(folder, str(p.relative_to(folder))) is not None


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._@+-]+", "_", name).strip("._") or "run"


def prepare_logdir(target: ViewTarget, tmp: Path) -> Path:
    """A log directory holding one run folder with a link to each trace, named as the plugin wants."""
    run = tmp / "logdir" / _safe_name(target.name)
    run.mkdir(parents=True)
    used: set[str] = set()
    for trace in target.traces:
        name = trace.name
        if not PLUGIN_PATTERN.match(name):
            gz = name.endswith(".gz")
            stem = re.sub(r"\.json(\.gz)?$", "", name)
            name = _safe_name(stem) + (layout.TRACE_SUFFIX if gz else layout.PLAIN_TRACE_SUFFIX)
        if name in used:  # the same file name in two rank folders
            name = f"{_safe_name(trace.parent.name)}_{name}"
        used.add(name)
        link = run / name
        try:
            link.symlink_to(trace.resolve())
        except OSError:  # no symlinks here (Windows without the privilege): copy
            shutil.copyfile(trace, link)
    return run.parent


# --------------------------------------------------------------------------- what the plugin needs, and its figures

# What torch-tb-profiler 0.4.3 loads from the web (its static/index.html and trace_embedding.html):
# every chart of its pages comes from Google Charts (the app calls google.charts.load at start), and
# its Trace view imports the trace viewer through a web-components polyfill from cdnjs.
GOOGLE_CHARTS_URL = "https://www.gstatic.com/charts/loader.js"
POLYFILL_HOST = "cdnjs.cloudflare.com"


def plugin_notes(target: ViewTarget) -> list[str]:
    """What ``view`` says before the URL: what the plugin needs from the web, what to use without it,
    and why the plugin's figures differ from gpudoctor's (with the run's own data-wait figure)."""
    run = safe.terminal_line(target.run_dir) if target.run_dir is not None else "RUN"
    lines = [
        f"The plugin's pages load code from the web: their charts (Overview, Operator, Kernel, Memory) Google "
        f"Charts ({GOOGLE_CHARTS_URL}), its Trace view a web-components polyfill ({POLYFILL_HOST}); without "
        "internet access they stay blank or spin. Offline, use gpudoctor's own HTML report, which fetches "
        f"nothing: gpudoctor report {run} -o report.html",
        "The plugin's figures are the trace's, not gpudoctor's: its steps are the profiled steps "
        "(ProfilerStep#N, with the profiler's own weight), and its DataLoader time counts only the "
        "enumerate(DataLoader)#….__next__ ops the trace holds inside them (0 where it holds none). gpudoctor "
        "times the wait for each batch with its own hooks on every step, and its step time is the unprofiled "
        "steady steps'.",
    ]
    if target.run_dir is not None:
        lines.append(_data_wait_line(target.run_dir))
    return lines


def _data_wait_line(run_dir: Path) -> str:
    """gpudoctor's data-wait figure for the run, as its report says it (``report.json``'s
    ``data_wait_share``, computed once by the diagnosis); the file is untrusted: a value that is
    not a percentage is not shown."""
    path = run_dir / layout.REPORT
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if not safe.not_regular(path) else None
    except (OSError, ValueError, RecursionError):
        data = None
    summary = data.get("summary") if isinstance(data, dict) else None
    for stat in summary if isinstance(summary, list) else ():
        if not isinstance(stat, dict) or stat.get("key") != "data_wait_share":
            continue
        value, window = stat.get("value"), stat.get("window")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 100:
            where = f" ({safe.terminal_line(window)})" if isinstance(window, str) and window else ""
            return f"gpudoctor's figure for this run: waiting for data {value:.1f}% of step time{where}."
    return (f"gpudoctor's figure for this run: not in its report (run gpudoctor analyze "
            f"{safe.terminal_line(run_dir)} to compute it).")


# --------------------------------------------------------------------------- TensorBoard


VIEW_EXTRA = 'pip install "gpudoctor[view]"'


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or one blocked on purpose
        return False


def check_installed() -> None:
    """TensorBoard and its PyTorch profiler plugin, the ``view`` extra: a one-line error naming it when absent."""
    missing = [package for module, package in (("tensorboard", "tensorboard"), ("torch_tb_profiler", "torch-tb-profiler"))
               if not _installed(module)]
    if missing:
        raise UsageError(f"`gpudoctor view` needs {' and '.join(missing)}, not installed here: {VIEW_EXTRA}")


def check_port_free(port: int) -> None:
    if not 0 < port < 65536:
        raise UsageError(f"--port {port}: give a port between 1 and 65535, or leave it out for a free one")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise UsageError(f"port {port} on 127.0.0.1 is in use ({err.strerror}); pick another with --port or leave it out") from err


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - loopback URL we built
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, b""


class TensorBoard:
    """One ``tensorboard`` child process on 127.0.0.1, logging to a file."""

    def __init__(self, logdir: Path, port: int, log_path: Path, title: str = "gpudoctor") -> None:
        self.logdir = logdir
        self.port = port
        self.log_path = log_path
        self.title = title
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def _log_tail(self, lines: int = 6) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        useful = [ln for ln in text.splitlines() if ln.strip() and "TensorFlow installation not found" not in ln]
        return " | ".join(useful[-lines:])

    def start(self, timeout_s: float = START_TIMEOUT_S, on_started: Callable[[int], object] | None = None) -> str:
        cmd = [
            sys.executable, "-m", "tensorboard.main",
            "--logdir", str(self.logdir),
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--load_fast", "false",
            "--window_title", self.title,
        ]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            )
        if on_started is not None:
            on_started(self.proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise TensorBoardError(f"TensorBoard exited with code {code} before serving: {self._log_tail()}")
            if not self.url:
                m = _URL.search(self.log_path.read_text(encoding="utf-8", errors="replace"))
                if m:
                    self.url = f"http://127.0.0.1:{m.group(1)}/"
            if self.url:
                try:
                    status, _ = _get(f"{self.url}data/plugin/{PLUGIN_NAME}/runs", timeout=2)
                except OSError:
                    status = 0
                if status == 200:
                    return self.url
                if status == 404:
                    raise TensorBoardError(f"TensorBoard runs without the PyTorch profiler plugin: {VIEW_EXTRA}")
            time.sleep(0.2)
        raise TensorBoardError(f"TensorBoard did not answer within {timeout_s:.0f} s: {self._log_tail()}")

    def wait(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def stop(self, grace_s: float = 10.0) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        self._signal(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self._signal(proc, getattr(signal, "SIGKILL", signal.SIGTERM))
            proc.wait(timeout=grace_s)

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: int) -> None:
        """Signal TensorBoard's whole session (its data-loading children too)."""
        try:
            if hasattr(os, "killpg"):
                os.killpg(proc.pid, sig)
            elif sig == signal.SIGTERM:
                proc.terminate()
            else:
                proc.kill()
        except ProcessLookupError:
            pass


def _die_with_parent() -> None:
    """``preexec_fn`` (Linux): TensorBoard gets SIGTERM when gpudoctor's process dies, even by SIGKILL."""
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return pid > 0
    return True


def reclaim_stale(tmp_root: Path | None = None) -> list[Path]:
    """Remove the temporary folders of ``view`` processes that died without cleaning up (SIGKILL).

    Only this user's ``gpudoctor-view-*`` folders with a pid file whose process is gone are
    touched; a TensorBoard still serving one (no ``PR_SET_PDEATHSIG`` here) is stopped first.
    """
    root = Path(tmp_root or tempfile.gettempdir())
    removed = []
    try:
        candidates = sorted(root.glob(TEMP_PREFIX + "*"))
    except OSError:
        return removed
    for folder in candidates:
        try:
            if folder.is_symlink() or not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pids = [int(x) for x in (folder / PID_FILE).read_text(encoding="utf-8").split()]
        except (OSError, ValueError):
            continue
        if not pids or _alive(pids[0]):
            continue
        for tb_pid in pids[1:]:
            if _alive(tb_pid) and str(folder) in _cmdline(tb_pid):
                try:
                    os.kill(tb_pid, signal.SIGTERM)
                except OSError:
                    pass
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            removed.append(folder)
    return removed


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def serve(run_dir: Path, port: int = 0, echo: Callable[[str], None] = print) -> int:
    """Serve RUN in TensorBoard until Ctrl-C (or SIGTERM/SIGHUP), which is raised (``Interrupted``)
    once TensorBoard is stopped and the temporary folder removed."""
    check_installed()
    target = find_traces(Path(run_dir))
    if port:
        check_port_free(port)
    # TensorBoard runs in its own session: stop it on SIGTERM and SIGHUP as on Ctrl-C.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for name in ("SIGTERM", "SIGHUP"):
            sig = getattr(signal, name, None)
            if sig is not None:
                previous[sig] = signal.signal(sig, _interrupt)
    try:
        return _serve(target, port, echo)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve(target: ViewTarget, port: int, echo: Callable[[str], None]) -> int:
    reclaim_stale()
    with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX) as tmp:
        pid_file = Path(tmp) / PID_FILE
        pid_file.write_text(f"{os.getpid()}\n", encoding="utf-8")
        logdir = prepare_logdir(target, Path(tmp))
        tb = TensorBoard(logdir, port, Path(tmp) / "tensorboard.log", title=f"gpudoctor: {target.name}")
        try:
            echo(f"Starting TensorBoard for {target.name} ({len(target.traces)} trace{'s' if len(target.traces) != 1 else ''})…")
            url = tb.start(on_started=lambda pid: pid_file.write_text(f"{os.getpid()} {pid}\n", encoding="utf-8"))
            for line in plugin_notes(target):
                echo(line)
            echo(f"TensorBoard, PyTorch profiler plugin: {url}#{PLUGIN_NAME}")
            echo(f"Perfetto, nothing to install: open {PERFETTO_URL}, choose 'Open trace file' and pick")
            for trace in target.traces:
                echo(f"  {trace.resolve()}")
            echo("(the trace is read in your browser, not uploaded). Press Ctrl-C to stop.")
            code = tb.wait()
            raise TensorBoardError(f"TensorBoard stopped by itself (exit code {code}): {tb._log_tail()}")
        except KeyboardInterrupt:
            echo("Stopping TensorBoard.")
            raise
        finally:
            tb.stop()

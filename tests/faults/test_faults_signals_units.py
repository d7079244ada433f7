"""The pieces of signal handling one by one (gpudoctor.signals, the runner's bookkeeping, cli.main),
in this process: fast, no training process. The end-to-end cases are in test_faults_signals.py."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
from pathlib import Path

import click
import pytest

from gpudoctor import cli, signals
from gpudoctor.collect.runner import _Signals
from gpudoctor.signals import Interrupted


@pytest.fixture
def saved_handlers():
    """Whatever a test does to the three handlers and the signal mask, pytest gets its own back."""
    before = {s: signal.getsignal(s) for s in signals.HANDLED}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for s, h in before.items():
        signal.signal(s, h)


def test_interrupted_is_a_keyboard_interrupt_that_names_its_signal_and_crosses_processes() -> None:
    err = Interrupted(signal.SIGTERM)
    assert isinstance(err, KeyboardInterrupt) and err.signum == 15
    assert pickle.loads(pickle.dumps(err)).signum == 15


def test_the_signal_is_found_behind_clicks_abort() -> None:
    try:
        try:
            raise Interrupted(signal.SIGHUP)
        except KeyboardInterrupt as e:
            raise click.exceptions.Abort() from e
    except click.exceptions.Abort as abort:
        assert signals.signum_of(abort) == signal.SIGHUP
    assert signals.signum_of(KeyboardInterrupt()) == signal.SIGINT  # a plain Ctrl-C


@pytest.mark.parametrize(("sig", "code", "line"), [(signal.SIGINT, 130, "gpudoctor: interrupted"),
                                                   (signal.SIGTERM, 143, "gpudoctor: stopped by SIGTERM"),
                                                   (signal.SIGHUP, 129, "gpudoctor: stopped by SIGHUP")])
def test_exit_code_and_line(sig: int, code: int, line: str) -> None:
    assert signals.exit_code(sig) == code and signals.stop_line(sig) == line
    assert signals.stopped_during_startup(signals.startup_detail(sig))
    assert not signals.stopped_during_startup("terminated by signal 15 (SIGTERM)")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_handling_raises_interrupted_and_gives_the_handlers_back(sig: int, saved_handlers) -> None:
    def previous(signum, frame):
        raise AssertionError("the previous handler ran inside the block")

    signal.signal(sig, previous)
    with signals.handling():
        with pytest.raises(Interrupted) as got:
            signal.raise_signal(sig)
        assert got.value.signum == sig
    assert signal.getsignal(sig) is previous


def test_a_signal_ignored_by_who_started_gpudoctor_stays_ignored(saved_handlers) -> None:
    """nohup: SIGHUP ignored, and gpudoctor does not take it back."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with signals.handling():
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is signals._raise
        signal.raise_signal(signal.SIGHUP)  # nothing happens


def test_deferred_holds_the_signals_until_the_block_ends(saved_handlers) -> None:
    got: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
    with signals.deferred():
        signal.raise_signal(signal.SIGTERM)
        assert got == []
    assert got == [signal.SIGTERM]


def test_a_forked_worker_gets_pythons_own_handling_back(saved_handlers) -> None:
    """A --jobs worker forked from gpudoctor: its parent decides, as before the handlers existed."""
    signals.install()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker
        ok = (signal.getsignal(signal.SIGINT) is signal.default_int_handler
              and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
              and signal.getsignal(signal.SIGHUP) == signal.SIG_DFL)
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"1"
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    assert signal.getsignal(signal.SIGTERM) is signals._raise  # this process keeps them


# --------------------------------------------------------------------------- the start-up hook


def test_the_hook_does_nothing_unless_it_names_the_point(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv(signals.STARTUP_HOOK_ENV, raising=False)
    signals.pause_point("entry")
    monkeypatch.setenv(signals.STARTUP_HOOK_ENV, f"parsed,run-dir:{tmp_path}")
    signals.pause_point("entry")
    assert list(tmp_path.iterdir()) == []


def _signal_when_marked(marker: Path, send) -> threading.Thread:
    def run() -> None:
        while not marker.exists():  # the hook's own marker: written just before it waits
            threading.Event().wait(0.005)
        send()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_hook_writes_its_marker_and_waits_for_a_handled_signal(monkeypatch, tmp_path: Path,
                                                                   saved_handlers) -> None:
    monkeypatch.setenv(signals.STARTUP_HOOK_ENV, f"run-dir:{tmp_path}")
    monkeypatch.setattr(signals, "HOOK_WAIT_S", 30.0)
    got: list[int] = []

    def record(signum, frame):  # the runner's handlers once the training process exists: they record
        signals.note(signum)
        got.append(signum)

    signal.signal(signal.SIGTERM, record)
    t = _signal_when_marked(tmp_path / "run-dir", lambda: os.kill(os.getpid(), signal.SIGTERM))
    signals.pause_point("run-dir")
    t.join()
    assert got == [signal.SIGTERM]
    assert (tmp_path / "run-dir").read_text().strip() == str(os.getpid())


def test_the_hook_goes_on_when_a_blocked_signal_is_pending(monkeypatch, tmp_path: Path, saved_handlers) -> None:
    """The training process before its handling is in place: the signal waits, blocked, and so does not the hook."""
    monkeypatch.setenv(signals.STARTUP_HOOK_ENV, f"child-start:{tmp_path}")
    monkeypatch.setattr(signals, "HOOK_WAIT_S", 30.0)
    got: list[int] = []
    signal.signal(signal.SIGHUP, lambda s, f: got.append(s))
    main = threading.get_ident()
    with signals.deferred():
        t = _signal_when_marked(tmp_path / "child-start", lambda: signal.pthread_kill(main, signal.SIGHUP))
        signals.pause_point("child-start")
        t.join()
        assert got == []
    assert got == [signal.SIGHUP]


# --------------------------------------------------------------------------- the runner's bookkeeping


class _Ended:
    """A training process that has ended."""

    def poll(self) -> int:
        return 0


def test_a_signal_the_script_reported_is_delivered_one_it_never_got_is_late() -> None:
    s = _Signals()
    s._pending = [(signal.SIGTERM, 10.0), (signal.SIGINT, 10.0)]
    s._child_got = [(signal.SIGTERM, 10.2)]
    s.settle()
    assert s.delivered == [signal.SIGTERM] and s.late == [signal.SIGINT] and s._pending == []


def test_a_signal_after_the_script_ended_is_late_and_one_before_it_started_stops_start_up() -> None:
    s = _Signals()
    with pytest.raises(Interrupted) as got:
        s._on_signal(signal.SIGHUP, None)
    assert got.value.signum == signal.SIGHUP
    s.proc = _Ended()  # type: ignore[assignment]
    s._on_signal(signal.SIGTERM, None)
    assert s.late == [signal.SIGTERM] and s._pending == []
    assert s.received == [signal.SIGHUP, signal.SIGTERM]


# --------------------------------------------------------------------------- cli.main


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_cli_main_turns_a_signal_into_one_line_and_128_plus_n(sig: int, monkeypatch, capsys, tmp_path: Path,
                                                               saved_handlers) -> None:
    def stopped(*_a, **_k):
        raise Interrupted(sig)

    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "load_and_analyze", stopped)
    monkeypatch.setattr(sys, "argv", ["gpudoctor", "analyze", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_:
        cli.main()
    assert exit_.value.code == 128 + sig
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if ln.strip()] == [signals.stop_line(sig)]
    assert signal.getsignal(signal.SIGTERM) is before  # called in-process: the handlers are given back


def test_the_entry_point_is_tiny(tmp_path: Path) -> None:
    """`gpudoctor/__main__.py` imports nothing heavy before its handlers are in place."""
    code = ("import sys; import gpudoctor.__main__; "
            "print(' '.join(m for m in ('click', 'gpudoctor.cli', 'gpudoctor.model', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_the_readme_exit_code_table_names_each_signals_code() -> None:
    from gpudoctor.errors import EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_TERMINATED

    assert [signals.exit_code(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == [
        EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_HANGUP]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Exit codes and CI gates", 1)[1].split("\n\n", 2)[1]
    rows = {int(line.split("|")[1]): line for line in table.splitlines() if line.startswith("| 1")}
    assert "SIGINT" in rows[130] and "SIGTERM" in rows[143] and "SIGHUP" in rows[129]


def test_every_start_up_point_is_named_where_gpudoctor_pauses() -> None:
    """signals.POINTS (what the hook documents) and the pause_point calls in the code are the same set."""
    import re

    package = Path(signals.__file__).parent
    used = {m for p in package.rglob("*.py") for m in re.findall(r'pause_point\("([\w-]+)"\)', p.read_text(encoding="utf-8"))}
    assert used == set(signals.POINTS)

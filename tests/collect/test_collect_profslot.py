"""Python's one profiler slot (``profslot``) and the cProfile window on every Python: enabled once per
step, never over another profiler, never clearing one; and ``--steps`` once step tracking stopped
(``StepLimit``). No torch: the tracker is driven by hand, the profilers are real cProfiles."""

from __future__ import annotations

import cProfile
import marshal
import sys
import threading
from pathlib import Path

import pytest

from gpudoctor.collect import profslot
from gpudoctor.collect import schedule as sched
from gpudoctor.collect.steps import CprofileWindow, StepTracker, StopAfterSteps
from gpudoctor.collect.steps.limit import StepLimit

NEW_SLOT = profslot.NEW_SLOT


class _Cuda:
    @staticmethod
    def is_initialized() -> bool:
        return False


class _Torch:
    cuda = _Cuda()


class _Writer:
    def __init__(self) -> None:
        self.lines = 0

    def write_text(self, text: str) -> None:
        self.lines += text.count("\n")

    def flush(self) -> None:
        pass


def work() -> int:
    return sum(i * i for i in range(200))


@pytest.fixture(autouse=True)
def _slot_freed(monkeypatch: pytest.MonkeyPatch):
    """Every test starts and ends with the slot free, cProfile unwatched and no instrument registered."""
    monkeypatch.setattr(cProfile.Profile, "enable", cProfile.Profile.enable)  # restored after watch_script()
    assert profslot.holder() == ""
    yield
    profslot.forget()
    leftover = profslot.holder()
    if sys.version_info >= (3, 12) and leftover:
        sys.monitoring.free_tool_id(profslot.PROFILER_ID)
    sys.setprofile(None)
    assert not leftover, f"a test left the slot held by {leftover}"


def _window(tmp_path: Path, start: int = 2, stop_before: int = 6) -> CprofileWindow:
    return CprofileWindow(True, start, stop_before, sched.CprofileBudget(budget_steps=1e9), tmp_path / "p.pstats")


def _tracker(tmp_path: Path, window: CprofileWindow, max_steps: int | None = None) -> tuple[StepTracker, _Writer]:
    w = _Writer()
    t = StepTracker(_Torch(), w, 0, None, max_steps, None, window)
    return t, w


def _step(t: StepTracker, opt: object) -> None:
    work()
    t.on_optimizer_step(opt)
    t.flush(from_step_return=True)


def _calls(path: Path, name: str) -> int:
    stats = marshal.loads(path.read_bytes())
    return sum(v[1] for k, v in stats.items() if k[2] == name)


def test_the_cprofile_window_is_enabled_once_per_step_on_every_python(tmp_path):
    """The 3.12 failure: the window's first step enabled cProfile twice ("Another profiling tool is
    already active") and step tracking stopped there."""
    window = _window(tmp_path)
    t, w = _tracker(tmp_path, window)
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    for _ in range(10):
        _step(t, opt)
    t.finish()
    assert t.error == "" and t.steps_seen == 10 and w.lines == 10
    assert (window.first, window.last, window.gave_way, window.error) == (2, 5, "", "")
    assert _calls(tmp_path / "p.pstats", "work") == 4  # steps 2..5, each one call of the loop's work
    assert profslot.holder() == ""


def test_the_window_gives_way_where_the_slot_is_held_and_steps_go_on(tmp_path):
    """The script's own cProfile holds the slot from before the window: gpudoctor's does not start, says
    why, and the script's profiler records every step (it was neither displaced nor cleared)."""
    window = _window(tmp_path)
    t, w = _tracker(tmp_path, window)
    opt = object.__new__(type("Opt", (), {}))
    theirs = cProfile.Profile()
    theirs.enable()
    try:
        t.optimizer_created()
        for _ in range(10):
            _step(t, opt)
        assert profslot.holder() == "cProfile"
    finally:
        theirs.disable()
    t.finish()
    assert t.error == "" and t.steps_seen == 10 and w.lines == 10
    assert window.first is None and window.gave_way.startswith("did not start at step 2: ")
    assert "is held by 'cProfile'" in window.gave_way and profslot.SLOT in window.gave_way
    assert not (tmp_path / "p.pstats").exists()
    theirs.create_stats()
    assert sum(v[1] for k, v in theirs.stats.items() if k[2] == "work") == 10


def test_the_scripts_cprofile_started_in_the_window_takes_the_slot(tmp_path):
    """The script enables its own cProfile in the middle of gpudoctor's window: gpudoctor's stops first
    (what it recorded is written), the script's enable() does not raise (3.12+) and is not cleared by
    gpudoctor's later pauses (3.11-)."""
    window = _window(tmp_path, 2, 9)
    t, w = _tracker(tmp_path, window)
    profslot.on_script_profiler(window.yield_to_script)
    profslot.watch_script()
    opt = object.__new__(type("Opt", (), {}))
    theirs = cProfile.Profile()
    t.optimizer_created()
    for i in range(10):
        if i == 4:
            theirs.enable()  # inside step 4, as a script's own line would
        _step(t, opt)
    assert profslot.holder() == "cProfile" and (sys.version_info >= (3, 12) or sys.getprofile() is theirs)
    theirs.disable()
    t.finish()
    assert t.error == "" and t.steps_seen == 10
    assert (window.first, window.last) == (2, 3)
    assert window.gave_way == ("stopped at step 4: the script started its own cProfile: Python runs one profiler "
                               "at a time, gpudoctor's gave way")
    assert _calls(tmp_path / "p.pstats", "work") == 2  # steps 2 and 3
    theirs.create_stats()
    assert sum(v[1] for k, v in theirs.stats.items() if k[2] == "work") == 6  # steps 4..9, all of them


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="from 3.12 no one can take the slot from an enabled cProfile")
def test_a_profile_function_set_behind_the_windows_back_is_not_cleared(tmp_path):
    """Up to 3.11: the script sets sys.setprofile during a step of the window; gpudoctor's pause would
    have cleared it with its disable(): the window stops without one, and the function stays set."""
    window = _window(tmp_path, 2, 9)
    t, w = _tracker(tmp_path, window)
    opt = object.__new__(type("Opt", (), {}))
    seen = []

    def theirs(frame, event, arg):  # noqa: ANN001
        seen.append(event)

    t.optimizer_created()
    for i in range(8):
        if i == 5:
            sys.setprofile(theirs)
        _step(t, opt)
    assert sys.getprofile() is theirs
    sys.setprofile(None)
    t.finish()
    assert t.error == "" and t.steps_seen == 8 and seen
    assert (window.first, window.last) == (2, 4) and window.gave_way.startswith("stopped at step 5: another profiler")


def test_gpudoctors_own_profilers_bypass_the_watch():
    calls = []
    profslot.on_script_profiler(calls.append)
    profslot.watch_script()
    own = profslot.OwnProfile()
    assert profslot.enable_own(own) == ""
    try:
        assert calls == [] and profslot.holder() == "cProfile"
        assert profslot.enable_own(profslot.OwnProfile()).endswith("is held by 'cProfile': Python runs one profiler at a time")
    finally:
        assert profslot.disable_own(own) is False
    theirs = cProfile.Profile()
    theirs.enable()
    theirs.disable()
    assert calls == ["the script started its own cProfile"]


# --------------------------------------------------------------------------- --steps once tracking stopped


def _break_open(t: StepTracker, at: int) -> None:
    orig = t._open

    def broken(now_ns, ru=None):  # noqa: ANN001
        if t.index >= at:
            raise RuntimeError("broken on purpose")
        return orig(now_ns, ru)

    t._open = broken


def test_steps_limit_holds_after_step_tracking_stopped(tmp_path):
    """Tracking breaks at step 4 of a --steps 10 run: the rows stop there, the error says from which
    step, and the limit counts the marking optimizer's steps (as the hooks tell it) to stop at 10."""
    t, w = _tracker(tmp_path, CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats"), max_steps=10)
    t.write_every_ns = 0
    t.every_boundary = True  # every boundary takes the slow path, which opens the next step with _open
    _break_open(t, 4)
    opt, other = object.__new__(type("Opt", (), {})), object.__new__(type("Other", (), {}))
    t.optimizer_created()
    for _ in range(4):
        _step(t, opt)
    assert not t.active and t.failed_at == 4 and w.lines == 4
    assert t.error == "step tracking stopped at step 4: RuntimeError: broken on purpose"
    lim = t.limit
    assert (lim.marker, lim.key, lim.done, lim.max_steps) == ("optimizer", id(opt), 4, 10)
    for _ in range(5):
        lim.mark("optimizer", id(opt))
        lim.mark("optimizer", id(other))  # another optimizer's step marks nothing, as for the tracker
        lim.mark("backward")  # nor does a call of another marker
    side = threading.Thread(target=lim.mark, args=("optimizer", id(opt)))
    side.start()
    side.join()  # nor a step on another thread
    assert lim.done == 9
    with pytest.raises(StopAfterSteps) as stop:
        lim.mark("optimizer", id(opt))
    assert stop.value.steps == 10 and stop.value.code == 0


def test_a_boundary_that_fails_at_the_last_step_still_stops(tmp_path):
    t, w = _tracker(tmp_path, CprofileWindow(False, 0, 0, sched.CprofileBudget(), tmp_path / "p.pstats"), max_steps=5)
    opt = object.__new__(type("Opt", (), {}))

    def on_boundary(index: int) -> None:
        if index == 4:
            raise RuntimeError("broken on purpose")

    t.on_boundary = on_boundary
    t.every_boundary = True  # every boundary takes the slow path, which calls on_boundary
    t.optimizer_created()
    for _ in range(4):
        _step(t, opt)
    with pytest.raises(StopAfterSteps) as stop:  # step 4's boundary fails: it is still the 5th step
        _step(t, opt)
    assert stop.value.steps == 5 and not t.active and t.error.startswith("step tracking stopped at step 5")


def test_dataloader_limit_counts_the_request_after_a_batch():
    lim = StepLimit(3, "dataloader", None, 1, threading.get_ident(), step_open=True)
    lim.batch_returned()  # the batch of step 1
    lim.batch_asked()  # ends step 1
    assert lim.done == 2
    lim.batch_asked()  # an epoch's end (StopIteration follows): no step was in progress
    assert lim.done == 2
    lim.batch_returned()
    with pytest.raises(StopAfterSteps):
        lim.batch_asked()


def test_the_loader_profile_is_written_as_the_window_closes_not_in_the_next_batchs_wait(tmp_path):
    """On 3.12 writing loader.pstats took 67 ms; done in the first batch after the window it was that
    batch's wait, an unprofiled step's, and GD201 read a DataLoader stall on a loop that had none
    (eval_without_no_grad's fix, CI). It is written in the boundary's bookkeeping as the window closes."""
    from gpudoctor.collect.loaderprof import LoaderProfile  # noqa: PLC0415

    window = _window(tmp_path, start=2, stop_before=4)
    t, _w = _tracker(tmp_path, window)
    lp = LoaderProfile(window, tmp_path / "loader.pstats")
    opt = object.__new__(type("Opt", (), {}))
    t.optimizer_created()
    batches = iter(range(100))
    asked_after_close = []
    for _ in range(6):
        if window.done:
            asked_after_close.append((tmp_path / "loader.pstats").is_file())
        lp.call(lambda it: (work(), next(it))[1], batches)
        _step(t, opt)
    t.finish()
    assert (window.first, window.last) == (2, 3)
    assert asked_after_close and all(asked_after_close)  # on disk before any batch after the window
    assert _calls(tmp_path / "loader.pstats", "work") == 2  # the batches of steps 2 and 3
    assert not lp.dirty and lp.error == ""


def test_a_script_profiler_on_another_thread_takes_the_slot_only_from_3_12(tmp_path):
    """Up to 3.11 each thread has its own profile function: the script's cProfile on a thread of its own
    takes nothing from the window's, which keeps recording (it used to 'give way' from that thread, whose
    disable could not reach the loop's thread: the window read stopped while its profiler stayed set).
    From 3.12 the slot is the process's: the window gives way and the slot is free for the script's."""
    window = _window(tmp_path, start=0, stop_before=100)
    profslot.on_script_profiler(window.yield_to_script)
    profslot.watch_script()
    window.on_step_start(0, [])
    assert window.resume_after_bookkeeping(0)
    errors = []

    def theirs() -> None:
        p = cProfile.Profile()
        try:
            p.enable()
            work()
            p.disable()
        except Exception as err:  # noqa: BLE001 - what the script would see
            errors.append(err)

    t = threading.Thread(target=theirs)
    t.start()
    t.join()
    assert not errors
    if NEW_SLOT:
        assert not window.running and window.gave_way.startswith("stopped at step 0: the script started its own cProfile")
        assert profslot.holder() == ""
    else:
        assert window.running and window.on and window.gave_way == ""
        assert sys.getprofile() is window.profiler
        window.pause_for_bookkeeping()
        window.stop()
        assert sys.getprofile() is None


# --------------------------------------------------------------------------- the watch while gpudoctor holds the slot (issue 41)


def _watched() -> dict[str, object]:
    if NEW_SLOT:
        return {n: getattr(sys.monitoring, n) for n in ("use_tool_id", "register_callback")}
    return {"setprofile": sys.setprofile}


def test_the_watch_is_on_only_while_gpudoctor_holds_the_slot_and_its_own_calls_pass_it():
    """The module's own functions are in place while gpudoctor holds nothing, wrapped while one of its
    profilers is enabled, and the same objects again once it is disabled; gpudoctor's own enable and disable
    (which call them, from 3.12) are no script taking the slot."""
    calls = []
    profslot.on_script_profiler(calls.append)
    before = _watched()
    own = profslot.OwnProfile()
    assert profslot.enable_own(own, "the test's profiler") == ""
    try:
        assert all(getattr(f, "_gpudoctor_watch", False) for f in _watched().values())
    finally:
        profslot.disable_own(own)
    assert _watched() == before and calls == [] and profslot.events == []


@pytest.mark.skipif(not NEW_SLOT, reason="sys.monitoring is 3.12's")
@pytest.mark.parametrize("how", ["use_tool_id", "register_callback", "lsprof"])
def test_anything_that_takes_tool_2_makes_gpudoctors_profiler_give_way(how):
    """use_tool_id(2, …), register_callback(2, …) and a direct _lsprof.Profiler().enable() (no cProfile.enable)
    while gpudoctor's profiler holds tool 2: it gives way first, the script's call succeeds ("tool 2 is already
    in use" before), and the event says how and who gave way."""
    import _lsprof

    own = profslot.OwnProfile()
    profslot.on_script_profiler(lambda what: profslot.disable_own(own))
    profslot.events.clear()
    assert profslot.enable_own(own, "the test's profiler") == ""
    mon = sys.monitoring
    if how == "lsprof":
        theirs = _lsprof.Profiler()
        theirs.enable()
        work()
        theirs.disable()
        assert sum(e.callcount for e in theirs.getstats()) > 0
    else:
        if how == "register_callback":
            mon.register_callback(2, mon.events.PY_START, None)
        mon.use_tool_id(2, "x")
        assert profslot.holder() == "x"
        mon.free_tool_id(2)
    assert [e["gave_way"] for e in profslot.events] == [["the test's profiler"]]
    what = {"use_tool_id": "the script took sys.monitoring's tool 2 for 'x' (use_tool_id)",
            "register_callback": "the script registered a callback for sys.monitoring's tool 2 (register_callback)",
            "lsprof": "the script took sys.monitoring's tool 2 for 'cProfile' (use_tool_id)"}[how]
    assert profslot.events[0]["what"] == what
    assert not getattr(mon.use_tool_id, "_gpudoctor_watch", False)  # gpudoctor let go: the module's own again
    profslot.events.clear()


# --------------------------------------------------------------------------- --steps stops the main thread only


def test_a_stop_reached_on_another_thread_is_raised_on_the_main_thread():
    """MainStop: on the main thread the stop raises there; from another thread it raises nothing in that thread
    and interrupts the main thread (blocked in join), where StopAfterSteps arrives with the count."""
    import signal

    from gpudoctor.collect.mainsignal import free_signal
    from gpudoctor.collect.steps.limit import MainStop

    sig = free_signal()
    if sig is None:
        pytest.skip("no real-time signal on this platform")
    stop = MainStop()
    stop.arm(sig)
    errors: list[BaseException] = []
    try:
        with pytest.raises(StopAfterSteps):
            stop.stop(3)

        def step() -> None:
            try:
                stop.stop(5)
            except BaseException as err:  # noqa: BLE001 - what the thread would print
                errors.append(err)
            threading.Event().wait(5)  # the main thread is interrupted in join, not after it

        t = threading.Thread(target=step, daemon=True)
        with pytest.raises(StopAfterSteps) as got:  # (in start() or join(): wherever the main thread waits)
            t.start()
            t.join()
        assert got.value.steps == 5 and t.is_alive()
    finally:
        stop.disarm()
    assert errors == [] and stop.raised == 2 and stop.unsent == ""
    assert signal.getsignal(sig) in (signal.SIG_DFL, None)


def test_the_main_thread_signal_is_one_helper_for_the_stop_and_the_time_window():
    """MainSignal (MainStop and TimeWindow both): installed, it reaches the main thread's handler from another
    thread; once the script installs its own handler for the signal, nothing is sent (it would run the script's
    handler) and the reason says so; restored, the handler that was there is back; no signal, a reason."""
    import signal

    from gpudoctor.collect.mainsignal import MainSignal, free_signal

    assert MainSignal().install(None, lambda s, f: None, "do it") == "no real-time signal on this platform to do it"
    sig = free_signal()
    if sig is None:
        pytest.skip("no real-time signal on this platform")
    got: list[int] = []
    carrier = MainSignal()
    assert carrier.install(sig, lambda s, f: got.append(threading.get_ident()), "test") == ""
    assert free_signal() != sig  # taken: the next instrument gets another one
    try:
        sent: list[str] = []
        t = threading.Thread(target=lambda: sent.append(carrier.send()))
        t.start()
        t.join()
        for _ in range(100):  # the handler runs between two bytecodes of the main thread
            if got:
                break
            threading.Event().wait(0.01)
        assert sent == [""] and got == [threading.main_thread().ident]
        signal.signal(sig, lambda s, f: None)  # the script takes the signal over
        assert carrier.send() == "the script installed its own handler for gpudoctor's signal"
    finally:
        carrier.restore()
    assert signal.getsignal(sig) in (signal.SIG_DFL, None) and carrier.sig is None
    assert carrier.send() == "the main thread could not be signalled"

"""The accounting window's weight (docs/account.md, "The accounting window"): which steps are
unprofiled, how a window's recorded steps are weighed against them, and the ledger scaled to the
unprofiled step (``analysis.weight.reweigh``) or given a detailed window's shape split
(``analysis.weight.split_like``). Hand-built ledgers and step records, exact figures."""

from __future__ import annotations

from dataclasses import replace

from gpudoctor.analysis.weight import WEIGHED_PARTS, reweigh, split_like
from gpudoctor.model.metrics import Ledger, LedgerSlice, WindowWeight
from gpudoctor.model.run import StepRecord
from gpudoctor.model.steady import (
    MIN_BARE_STEPS,
    figure_steps,
    step_figures,
    unprofiled_steps,
    window_weight,
)

MS = 1_000_000
DEVICE = {"gpu_fp32_conv", "gpu_fp32_matmul", "gpu_conv", "gpu_matmul", "gpu_optimizer", "gpu_compute", "h2d", "d2h"}


def _ledger(parts_ms: dict[str, float], *, basis: str = "gpu", windows: int = 5) -> Ledger:
    slices = tuple(
        LedgerSlice(c, int(v * MS), 0.0, "device" if basis == "gpu" and c in DEVICE else "host", "", "trace",
                    after_sync_ns=int(v * MS) // 2 if c == "launch_overhead" else 0)
        for c, v in parts_ms.items()
    )
    total = sum(s.ns for s in slices)
    slices = tuple(replace(s, pct=round(100.0 * s.ns / total, 4)) for s in slices)
    return Ledger(key="trace:t", basis=basis, label="t", window=f"{windows} windows", windows=windows,
                  total_ns=total, slices=slices, device=0 if basis == "gpu" else None)


def _weight(ratio: float) -> WindowWeight:
    return WindowWeight(ratio=ratio, window_step_ns=int(ratio * 10 * MS), bare_step_ns=10 * MS, window_steps=5,
                        bare_steps=8, source="CUDA events")


def _step(i: int, wall_ms: float, window: str = "", gpu_ms: float | None = None) -> StepRecord:
    return StepRecord(index=i, start_ns=i * 100 * MS, wall_ns=int(wall_ms * MS),
                      gpu_ns=int(gpu_ms * MS) if gpu_ms is not None else None, window=window)


# --------------------------------------------------------------------------- which steps, how weighed


def test_unprofiled_steps_leave_out_every_instrumented_step_and_the_one_after_it():
    windows = {10: "warmup", 11: "active", 12: "active", 13: "cprofile"}
    steady = tuple(_step(i, 10.0, windows.get(i, "")) for i in range(1, 20))
    bare = unprofiled_steps(steady)
    assert [s.index for s in bare] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 18, 19]  # 14 follows cProfile's window
    # the run's figures are of them where there are enough (the summary, the account, the stderr line)
    figs = step_figures(tuple(replace(s, wall_ns=s.wall_ns * (3 if s.window else 1)) for s in steady))
    assert figs.steps == len(bare) and figs.unprofiled and figs.median_ms == 10.0
    few = figure_steps(steady[8:])  # steps 9-19: 9 and 15-19 unprofiled (6)
    assert [s.index for s in few] == [9, 15, 16, 17, 18, 19]
    assert [s.index for s in figure_steps(steady[9:])] == [15, 16, 17, 18, 19]  # 5: enough
    assert figure_steps(steady[9:18]) == steady[9:18]  # 10-18: 4 unprofiled, too few: every steady step


def test_a_window_is_weighed_by_cuda_events_where_both_sides_carry_them():
    bare = [_step(i, 4.0, gpu_ms=10.0 + (i % 3)) for i in range(8)]  # GPU-bound: the host enqueues in 4 ms
    recorded = [_step(20 + i, 9.0, "active", gpu_ms=12.0) for i in range(5)]
    w = window_weight(recorded, bare)
    assert w is not None and w.source == "CUDA events"
    assert w.bare_step_ns == 11 * MS and w.window_step_ns == 12 * MS and w.ratio == 12 / 11
    # one side without events: both are compared on the host's wall time
    w = window_weight([replace(s, gpu_ns=None) for s in recorded], bare)
    assert w is not None and w.source == "wall" and w.ratio == 9.0 / 4.0


def test_no_weight_without_enough_unprofiled_steps():
    recorded = [_step(20 + i, 9.0, "active") for i in range(5)]
    assert window_weight(recorded, [_step(i, 4.0) for i in range(MIN_BARE_STEPS - 1)]) is None
    assert window_weight([], [_step(i, 4.0) for i in range(MIN_BARE_STEPS)]) is None


# --------------------------------------------------------------------------- the scaling


def test_a_heavy_window_has_its_host_work_scaled_to_the_unprofiled_step():
    # five 20 ms windows: 8 ms busy, 8 ms launching, 2 ms Python, 2 ms waiting for a batch, per window
    led = _ledger({"gpu_compute": 40, "data_loading": 10, "launch_overhead": 40, "other_cpu": 10})
    out = reweigh(led, _weight(4 / 3), 1.10)
    assert out.weight is not None and out.weight.scaled and out.weight.ratio == 4 / 3
    assert out.total_ns == 75 * MS == sum(s.ns for s in out.slices)  # 100 ms ÷ 1.333
    ns = {s.component: s.ns for s in out.slices}
    # the device's busy time and the wait as recorded; the 25 ms from the host's work, in proportion
    assert ns["gpu_compute"] == 40 * MS and ns["data_loading"] == 10 * MS
    assert ns["launch_overhead"] == 20 * MS and ns["other_cpu"] == 5 * MS and out.weight.removed_ns == 25 * MS
    assert abs(sum(s.pct for s in out.slices) - 100.0) < 1e-3
    assert round(out.pct("launch_overhead"), 4) == round(100 * 20 / 75, 4)
    # what lay in gaps a sync began shrinks with its part
    assert out.get("launch_overhead").after_sync_ns == 10 * MS
    assert out.windows == led.windows and out.key == led.key


def test_a_light_window_is_as_recorded_with_its_weight_stated():
    led = _ledger({"gpu_compute": 40, "launch_overhead": 40, "other_cpu": 10})
    out = reweigh(led, _weight(1.08), 1.10)
    assert out.slices == led.slices and out.total_ns == led.total_ns
    assert out.weight is not None and not out.weight.scaled and out.weight.removed_ns == 0
    assert reweigh(led, None, 1.10) is led  # a bare trace: nothing to weigh it against


def test_what_the_host_work_cannot_hold_comes_from_the_waits_never_from_the_device():
    led = _ledger({"gpu_compute": 50, "data_loading": 30, "other_cpu": 20})  # 100 ms; ratio 2: 50 ms out
    out = reweigh(led, _weight(2.0), 1.10)
    ns = {s.component: s.ns for s in out.slices}
    assert ns == {"gpu_compute": 50 * MS} and out.total_ns == 50 * MS  # 20 ms of work, then 30 of waiting
    out = reweigh(led, _weight(1.25), 1.10)  # 20 ms out: the work alone holds it
    assert {s.component: s.ns for s in out.slices} == {"gpu_compute": 50 * MS, "data_loading": 30 * MS}
    # more than every host part holds: the device's time stays, the total with it
    out = reweigh(_ledger({"gpu_compute": 80, "other_cpu": 20}), _weight(2.0), 1.10)
    assert {s.component: s.ns for s in out.slices} == {"gpu_compute": 80 * MS} and out.total_ns == 80 * MS
    assert out.weight.removed_ns == 20 * MS


def test_on_a_cpu_ledger_the_work_is_scaled_and_the_waits_kept():
    led = _ledger({"data_loading": 20, "launch_overhead": 30, "cpu_compute": 40, "other_cpu": 10}, basis="cpu")
    out = reweigh(led, _weight(1.25), 1.10)
    ns = {s.component: s.ns for s in out.slices}
    assert out.total_ns == 80 * MS and ns["data_loading"] == 20 * MS
    assert sum(ns[c] for c in ns if c in WEIGHED_PARTS) == 60 * MS  # 80 ms of work, 20 out
    assert ns["cpu_compute"] == 30 * MS and ns["launch_overhead"] == int(22.5 * MS)


# --------------------------------------------------------------------------- shapes from the detailed window


def test_a_window_without_shapes_splits_its_kernels_as_the_detailed_one_does():
    plain = _ledger({"gpu_conv": 30, "gpu_optimizer": 5, "gpu_compute": 45, "other_cpu": 20})
    detail = _ledger({"gpu_fp32_conv": 24, "gpu_conv": 6, "gpu_fp32_matmul": 10, "gpu_matmul": 5,
                      "gpu_optimizer": 5, "gpu_compute": 15, "launch_overhead": 35})
    out = split_like(plain, detail, "t.11")
    ns = {s.component: s.ns for s in out.slices}
    # the convolution and other kernels together (75 ms) in the detailed window's proportions (24:6:10:5:15): a
    # convolution is known there by the op that launched it, cuDNN's layout kernels too, which the plain
    # window files with the other kernels by their names (cudnn_benchmark_off on the H200: 30% of its kernel
    # time read "FP32 matmul", and GD402 fired on convolutions)
    assert ns == {"gpu_fp32_conv": 30 * MS, "gpu_conv": int(7.5 * MS), "gpu_fp32_matmul": int(12.5 * MS),
                  "gpu_matmul": int(6.25 * MS), "gpu_optimizer": 5 * MS, "gpu_compute": int(18.75 * MS),
                  "other_cpu": 20 * MS}
    assert out.total_ns == plain.total_ns == sum(ns.values())
    assert all(s.side == ("device" if s.component in DEVICE else "host") for s in out.slices)
    assert any("t.11" in n for n in out.notes)
    # a window with shapes of its own, or a detailed one without any, leaves it as it is
    assert split_like(detail, detail) is detail
    assert split_like(plain, plain) is plain


def test_the_weight_note_says_what_was_cut_and_of_which_windows():
    # rules.account.weight_note: what the report says of the scaling must be true of it
    from dataclasses import replace as _replace

    from gpudoctor.rules.account import weight_note

    # the work alone holds the cut: the waits (and on a GPU ledger the device's busy time) are as recorded
    led = _ledger({"gpu_compute": 50, "data_loading": 30, "other_cpu": 20})
    out = reweigh(led, _weight(1.25), 1.10)
    assert out.weight.waits_removed_ns == 0 and out.weight.scaled_windows == led.windows
    note = weight_note(out, 1.10)
    assert f"taken out of its {led.windows} windows" in note
    assert "the device's busy time and the waits are as recorded" in note
    # the work cannot hold it: 30 ms came out of the waits, and the note says so (it once said "as recorded")
    out = reweigh(led, _weight(2.0), 1.10)
    assert out.weight.waits_removed_ns == 30 * MS
    note = weight_note(out, 1.10)
    assert "the waits" not in note.split("as recorded")[0] and "30.00 ms of it came out of the waits" in note
    assert "the device's busy time is as recorded" in note
    # a CPU-only trace: no device to speak of
    cpu = reweigh(_ledger({"data_loading": 20, "cpu_compute": 40, "other_cpu": 40}, basis="cpu"), _weight(1.25), 1.10)
    note = weight_note(cpu, 1.10)
    assert "device" not in note and "the waits are as recorded" in note
    # a ledger of steps (a CPU run: the unprofiled steps, their trace's split): the windows are the trace's,
    # not the steps the ledger sums
    steps = _replace(cpu, basis="steps", windows=9)
    note = weight_note(steps, 1.10)
    assert f"the {cpu.windows} windows of its trace" in note and "9 windows" not in note and "device" not in note

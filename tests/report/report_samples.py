"""Hand-built reports for the renderer tests: one canonical, one empty, one hostile.

The canonical report exercises every part a renderer shows (the account: where
the step goes and the top actions; findings of every severity with their claims on
the ledger, one included in another's, GD101 as the headline after its causes,
evidence with settings and call sites, snippets, every checklist status, summary,
environment, steps, NVML and psutil samples, two traces with ledgers, utilization,
gap histogram, kernels, ops, ranks, errors, the rule catalogue).
Its numbers are made up but consistent; the renderers must show them as they are.
"""

from __future__ import annotations

from gpudoctor.model import (
    REPORT_SCHEMA_VERSION,
    Account,
    Action,
    CallSite,
    ChecklistItem,
    ChecklistStatus,
    Claim,
    Collected,
    Confidence,
    CpuSummary,
    Device,
    DeviceInfo,
    DeviceUtilization,
    Evidence,
    Finding,
    Fix,
    Gain,
    GapCause,
    GapCauseTotal,
    GpuSample,
    HistogramBin,
    IdleGap,
    Injection,
    KernelStats,
    Ledger,
    LedgerSlice,
    Location,
    Manifest,
    MemoryStats,
    Metric,
    NameStat,
    ProcessSample,
    RankRow,
    RankSummary,
    Report,
    RuleInfo,
    RunData,
    RunStatus,
    Samples,
    SettingRef,
    Severity,
    StepBreakdown,
    StepRecord,
    StepWindow,
    SummaryStat,
    SyncSummary,
    TimeRange,
    TraceMetrics,
    TransferStat,
    UtilizationBin,
    Verification,
    VerifyStatus,
    Window,
    WindowKind,
)

MS = 1_000_000
RUN_DIR = "gpudoctor-runs/train-20261121-101500"
CWD = "/home/ada/proj"

RULE_DOC_GD201 = """GD201 dataloader-stall: the training loop waits for the next batch.

What it detects
---------------
Steps in which the main process is blocked in ``DataLoader.__next__``.

How to fix
----------
Raise ``num_workers`` on the DataLoader::

    DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True)
"""


def _rules() -> tuple[RuleInfo, ...]:
    return (
        RuleInfo("GD101", "gpu-idle", "The GPU is idle for a large share of the step.", "GD101 gpu-idle: the GPU waits.\n\nWhat it detects\n---------------\nIdle gaps on the device."),
        RuleInfo("GD104", "host-sync", "Host synchronizations stall the GPU queue.", "GD104 host-sync.\n\nWhat it detects\n---------------\nCalls such as .item() inside the step."),
        RuleInfo("GD201", "dataloader-stall", "The training loop waits for the next batch.", RULE_DOC_GD201),
        RuleInfo("GD301", "pageable-h2d", "Host-to-device copies from pageable memory.", "GD301 pageable-h2d.\n\nWhat it detects\n---------------\nMemcpy HtoD (Pageable -> Device)."),
        RuleInfo("GD302", "blocking-copy", "Synchronous copies block the host.", "GD302 blocking-copy.\n\nWhat it detects\n---------------\nSynchronous copies."),
        RuleInfo("GD401", "fp32-matmul", "Matrix math runs in FP32 where AMP would use tensor cores.", "GD401 fp32-matmul.\n\nWhat it detects\n---------------\nFP32 GEMMs."),
    )


# rank 0's ledger: 5 steps of 83 ms (see _metrics), in ms over the 5 steps
PARTS_MS = {
    "gpu_fp32_matmul": 60, "gpu_compute": 85, "h2d": 30, "data_loading": 160, "sync_wait": 35,
    "launch_overhead": 10, "optimizer": 20, "other_cpu": 15,
}
LEDGER_KEY = f"trace:{RUN_DIR}/rank0.pt.trace.json.gz"
TOTAL_MS = 415


def _claim(part: str, ms: float, granted_ms: float | None = None) -> Claim:
    g = ms if granted_ms is None else granted_ms
    return Claim(part, LEDGER_KEY, int(ms * MS), int(g * MS), PARTS_MS[part] * MS, TOTAL_MS * MS)


def _ledger(rank: int) -> Ledger:
    device = ("gpu_fp32_matmul", "gpu_compute", "h2d")
    return Ledger(
        key=f"trace:{RUN_DIR}/rank{rank}.pt.trace.json.gz",
        basis="gpu",
        label=f"rank {rank}",
        window="5 ProfilerStep windows",
        windows=5,
        total_ns=TOTAL_MS * MS,
        slices=tuple(
            LedgerSlice(k, v * MS, round(100.0 * v / TOTAL_MS, 4), "device" if k in device else "host",
                        "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" if k == "data_loading" else "",
                        "trace")
            for k, v in PARTS_MS.items()
        ),
        device=0,
        rank=rank,
    )


def _account() -> Account:
    return Account(
        headline="GPU idle 57.8% of step time: waiting for the DataLoader 38.6%, host synchronizations 8.4%, "
        "the optimizer on the host 4.8%, other host work (Python, CPU ops) 3.6%, launch and dispatch overhead 2.4%; "
        "busy with other kernels 20.5%, FP32 matmuls 14.5%, host→device copies 7.2%",
        ledger=_ledger(0),
        step_ns=83 * MS,
        step_source="mean of 23 steady steps",
        actions=(
            Action("GD201", "dataloader-stall", 38.5542, 51_000_000, None, ("data_loading",), 36.6265, 52_600_000),
            Action("GD301", "pageable-h2d", 7.2289, 45_000_000, None, ("h2d",), None, 46_600_000),
            Action("GD401", "fp32-matmul", 4.1928, 41_520_000, None, ("gpu_fp32_matmul",), 2.5157, 44_510_000),
        ),
        claimed_pct=49.9759,
        notes=("each action's expected gain is its rule's model; the bound is its whole exclusive share: the step after is at least the bound's figure",),
    )


def _verified() -> Verification:
    """--verify: GD201's fix measured in trial runs."""
    site = CallSite("train.py", 31, "main")
    return Verification(
        VerifyStatus.CONFIRMED,
        "1.72× faster with the fix: median step 83.0 ms → 48.3 ms (95% CI 1.66×–1.92×, p < 0.001; 3 runs with the "
        "fix, 3 without; 75 and 75 steady steps)",
        changes=(
            Injection("dataloader", "num_workers", 4, site, text="DataLoader num_workers=4 at train.py:31"),
            Injection("dataloader", "persistent_workers", True, site, text="DataLoader persistent_workers=True at train.py:31"),
        ),
        speedup=1.7184, ci=(1.66, 1.92), p_value=1.2e-20, min_speedup=1.05, trials=3, baseline_runs=3, steps=30,
        steps_baseline=75, steps_trial=75, baseline_step_ns=83 * MS, trial_step_ns=48_300_000,
        runs=("verify/GD201/1", "verify/GD201/2", "verify/GD201/3"),
    )


def _findings() -> tuple[Finding, ...]:
    loader = Location(f"{CWD}/train.py", 31, None, "main")
    return (
        Finding(
            code="GD201",
            name="dataloader-stall",
            severity=Severity.ERROR,
            confidence=Confidence.MEASURED,
            message="The loop waited 31.6 ms per step for the next batch: 38.0% of step time.",
            fix=Fix(
                instruction="Set num_workers=4 (and persistent_workers=True) on the DataLoader at train.py:31.",
                before="loader = DataLoader(ds, batch_size=64, shuffle=True)",
                after="loader = DataLoader(ds, batch_size=64, shuffle=True,\n                    num_workers=4, persistent_workers=True)",
            ),
            evidence=Evidence(
                metrics=(
                    Metric("data_wait_share", 38.0, "%", "steps"),
                    Metric("data_wait_per_step", 31.6, "ms"),
                    Metric("steps_measured", 120, "count"),
                ),
                time_ranges=(TimeRange(1_000_000_000, 1_031_600_000, "ProfilerStep#12 wait"),),
                settings=(SettingRef("DataLoader.num_workers", 0, loader),),
                notes=("All 120 steps were timed; 5 were profiled.",),
            ),
            gain=Gain(38.5542, 1.627, "if the wait were hidden entirely", (_claim("data_loading", 160),), (),
                      36.6265, 1.578, 0.95, "4 workers: step = max(compute, load ÷ 4)"),
            location=loader,
            verification=_verified(),
        ),
        Finding(
            code="GD301",
            name="pageable-h2d",
            severity=Severity.WARNING,
            confidence=Confidence.MEASURED,
            message="61 host-to-device copies (2.30 GiB) came from pageable memory, 8.1% of step time.",
            fix=Fix(
                instruction="Pass pin_memory=True to the DataLoader and copy with .to(device, non_blocking=True).",
                before="x = x.to(device)",
                after="x = x.to(device, non_blocking=True)",
            ),
            evidence=Evidence(
                metrics=(
                    Metric("pageable_h2d_count", 61, "count"),
                    Metric("pageable_h2d_bytes", 2_469_606_195, "bytes"),
                    Metric("h2d_bandwidth", 3.7, "GB/s"),
                ),
                settings=(SettingRef("DataLoader.pin_memory", False, loader),),
            ),
            gain=Gain(7.2289, 1.078, "", (_claim("h2d", 30),)),
            location=Location(f"{CWD}/train.py", 44, 9, "train_step"),
            verification=Verification(
                VerifyStatus.INCONCLUSIVE,
                "a run with the fix failed: verify/GD301/1: failed: RuntimeError: <pin memory> at train.py:44",
                changes=(Injection("dataloader", "pin_memory", True, CallSite("train.py", 31),
                                   text="DataLoader pin_memory=True at train.py:31"),),
                min_speedup=1.05, trials=0, baseline_runs=1, steps=30, runs=("verify/GD301/1",),
                errors=("verify/GD301/1: failed: RuntimeError: <pin memory> at train.py:44",),
            ),
        ),
        Finding(
            code="GD302",
            name="blocking-copy",
            severity=Severity.INFO,
            confidence=Confidence.MEASURED,
            message="61 copies block the host for 630 ms; GPU idle after syncs 8.4% of step time.",
            fix=Fix(instruction="Copy from pinned memory with non_blocking=True."),
            gain=Gain(0.0, 1.0, "included in GD102 (its fix wins that time first)",
                      (_claim("sync_wait", 35, 0),), ("GD102",)),
        ),
        Finding(
            code="GD401",
            name="fp32-matmul",
            severity=Severity.INFO,
            confidence=Confidence.INFERRED,
            message="FP32 matrix math took 41.0% of kernel time; autocast to bfloat16 would use tensor cores.",
            fix=Fix(
                instruction="Wrap the forward pass in torch.autocast(device_type='cuda', dtype=torch.bfloat16).",
                before="out = model(x)",
                after="with torch.autocast(device_type=\"cuda\", dtype=torch.bfloat16):\n    out = model(x)",
            ),
            evidence=Evidence(metrics=(Metric("fp32_eligible_pct_of_gpu", 41.0, "%", "kernel time"),)),
            gain=Gain(4.1928, 1.044, "estimated at 2x on eligible kernels", (_claim("gpu_fp32_matmul", 17.4),), (),
                      2.5157, 1.026, 0.6, "Tensor Cores ~2.5x on A100 BF16 matmuls"),
            location=Location(f"{CWD}/train.py", 52),
            verification=Verification(VerifyStatus.NOT_TRIED, "AMP changes numerics: try it in the script and check the loss"),
        ),
        Finding(
            code="GD101",
            name="gpu-idle",
            severity=Severity.ERROR,
            confidence=Confidence.MEASURED,
            message="GPU 0 idle 57.8% of the 5 step windows; of step time: waiting for the DataLoader 38.6%; "
            "the causes are findings GD201 (38.6% of step time)",
            fix=Fix(instruction="Fix its causes, largest first: GD201."),
            evidence=Evidence(metrics=(Metric("gpu_idle_pct", 57.8, "%", "steps"), Metric("idle_gaps_over_1ms", 81, "count"))),
            gain=Gain(None, None, "the GPU idle time is the sum of its causes: each cause finding gains its own part"),
            rank=0,
        ),
    )


def _checklist() -> tuple[ChecklistItem, ...]:
    return (
        ChecklistItem("dataloader-workers", "DataLoader workers (num_workers > 0)", ChecklistStatus.RECOMMENDED,
                      "num_workers=0 at train.py:31 and the loop waits 38.0% of step time", ("GD201",), Gain(38.0, 1.61), 2),
        ChecklistItem("pinned-memory", "Pinned memory and non-blocking copies", ChecklistStatus.RECOMMENDED,
                      "61 pageable copies", ("GD301",), Gain(8.1, 1.09), 1),
        ChecklistItem("cudnn-benchmark", "cudnn.benchmark for fixed input shapes", ChecklistStatus.APPLIED,
                      "torch.backends.cudnn.benchmark=True at train.py:12", ("GD402",), None, 4),
        ChecklistItem("no-grad-eval", "torch.no_grad() in evaluation", ChecklistStatus.NOT_APPLICABLE,
                      "the script has no evaluation loop", ("GD701",), None, 6),
        ChecklistItem("ddp", "DistributedDataParallel over DataParallel", ChecklistStatus.NOT_APPLICABLE,
                      "one process, one GPU", ("GD601",)),
        ChecklistItem("amp", "Mixed precision (autocast) and TF32", ChecklistStatus.RECOMMENDED,
                      "FP32 matrix math is 41.0% of kernel time", ("GD401",), Gain(4.2, 1.04), 10),
        ChecklistItem("batch-size", "A batch size that fills the GPU", ChecklistStatus.NO_PROBLEM_SEEN,
                      "GD103: launch and dispatch overhead idles the GPU 2.4% of step time (threshold 5%)",
                      ("GD104", "GD103"), None, 3),
        ChecklistItem("torch-compile", "torch.compile", ChecklistStatus.NOT_MEASURABLE,
                      "needs a CUDA run with stacks to judge the launch overhead", ("GD403",), None, 9),
    )


def _metrics(rank: int, busy_shift: float) -> TraceMetrics:
    t0 = 1_000_000_000
    steps = tuple(StepWindow(10 + i, t0 + i * 83 * MS, t0 + (i + 1) * 83 * MS) for i in range(5))
    breakdown = tuple(
        StepBreakdown(
            s.step,
            s.start_ns,
            83 * MS,
            {
                "gpu_fp32_matmul": 12 * MS,
                "gpu_compute": (19 - i) * MS,
                "h2d": 6 * MS,
                "data_loading": (30 + i) * MS,
                "sync_wait": 7 * MS,
                "launch_overhead": 2 * MS,
                "optimizer": 4 * MS,
                "other_cpu": 3 * MS,
            },
        )
        for i, s in enumerate(steps)
    )
    span = Window(WindowKind.SPAN, t0, t0 + 415 * MS, "first to last GPU activity")
    steps_window = Window(WindowKind.STEPS, t0, t0 + 415 * MS, "5 ProfilerStep windows (#10..#14)")
    util = DeviceUtilization(
        device=0,
        busy_ns_span=int(147.7 * MS),
        span=span,
        idle_pct_span=64.4,
        busy_ns_steps=int(147.7 * MS),
        idle_pct_steps=64.4,
        steps_window=steps_window,
        gaps_window=WindowKind.STEPS,
        gap_count=312,
        gaps_over_1ms=81,
        gap_causes=(
            GapCauseTotal(GapCause.DATALOADER, 5, 152 * MS, 57.0, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"),
            GapCauseTotal(GapCause.SYNC, 40, 35 * MS, 13.1, "cudaStreamSynchronize"),
            GapCauseTotal(GapCause.SHORT, 260, 20 * MS, 7.5),
            GapCauseTotal(GapCause.OTHER, 7, 60 * MS, 22.4, "aten::to"),
        ),
        gap_histogram=(
            HistogramBin(0, 10_000, 180, 600_000),
            HistogramBin(10_000, 100_000, 51, 2_100_000),
            HistogramBin(100_000, 1_000_000, 0, 0),
            HistogramBin(1_000_000, 10_000_000, 76, 110 * MS),
            HistogramBin(10_000_000, 100_000_000, 5, 154 * MS),
        ),
        top_gaps=(
            IdleGap(0, t0 + 1 * MS, t0 + 31 * MS, GapCause.DATALOADER, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10),
            IdleGap(0, t0 + 84 * MS, t0 + 115 * MS, GapCause.DATALOADER, "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 11),
        ),
        busy_timeline=tuple(
            UtilizationBin(t0 + i * 41_500_000, t0 + (i + 1) * 41_500_000, round(min(100.0, 20.0 + busy_shift + 7.5 * (i % 4)), 1))
            for i in range(10)
        ),
    )
    return TraceMetrics(
        path=f"{RUN_DIR}/rank{rank}.pt.trace.json.gz",
        has_gpu_activity=True,
        event_count=48_211,
        rank=rank,
        world_size=2,
        devices=(DeviceInfo(0, "NVIDIA A100-SXM4-80GB", "8.0", 85_899_345_920),),
        step_source="ProfilerStep",
        steps=steps,
        windows=(span, steps_window),
        utilization=(util,),
        breakdown=breakdown,
        breakdown_mean_pct={k: round(100.0 * v / TOTAL_MS, 3) for k, v in PARTS_MS.items()},
        ledger=_ledger(rank),
        transfers=(
            TransferStat("HtoD", "pageable", 61, 2_469_606_195, 630 * MS, 3.92, 61, 40_000_000, 12.2),
            TransferStat("DtoH", "pageable", 5, 20, 50_000, 0.0004, 5, 4, 1.0),
        ),
        kernels=KernelStats(
            count=9_512,
            total_ns=int(140.2 * MS),
            p50_ns=8_000,
            p90_ns=61_000,
            max_ns=4_100_000,
            under_10us_pct=54.3,
            launch_count=9_512,
            launch_total_ns=48 * MS,
            launch_to_kernel_ratio=0.34,
            median_launch_delay_ns=11_000,
            tensor_core_ns=0,
            tensor_core_pct=0.0,
            fp32_eligible_op_ns=57 * MS,
            fp32_eligible_pct_of_gpu=41.0,
            eligible_dtypes_known=True,
            top=(
                NameStat("volta_sgemm_128x64_nn", 1_250, int(38.1 * MS), 410_000, 27.2),
                NameStat("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", 3_100, int(19.4 * MS), 90_000, 13.8),
                NameStat("cudnn::bn_fw_tr_1C11_kernel_NCHW", 600, int(12.9 * MS), 60_000, 9.2),
                NameStat("Memcpy HtoD (Pageable -> Device)", 61, int(9.6 * MS), 400_000, 6.8),
            ),
            optimizer_kernels_per_step=412.0,
        ),
        syncs=SyncSummary(
            40,
            35 * MS,
            8.4,
            by_name=(NameStat("cudaStreamSynchronize", 35, 33 * MS, 2 * MS, 94.3), NameStat("aten::item", 5, 2 * MS, 1 * MS, 5.7)),
            by_frame=(NameStat("train.py(47): train_step", 40, 35 * MS, 2 * MS, 100.0),),
        ),
        cpu=CpuSummary(
            window=steps_window,
            dataloader_ns=160 * MS,
            dataloader_pct=38.6,
            op_ns=120 * MS,
            op_pct=28.9,
            python_ns=30 * MS,
            python_pct=7.2,
            optimizer_ns=20 * MS,
            top_ops=(
                NameStat("aten::to", 61, 40 * MS, 2 * MS, 33.3),
                NameStat("aten::convolution", 250, 30 * MS, 300_000, 25.0),
                NameStat("Optimizer.step#SGD.step", 5, 20 * MS, 4 * MS, 16.7),
            ),
        ),
        memory=(MemoryStats(0, 6_442_450_944, 8_589_934_592, 85_899_345_920, 12, 3, 0),),
        has_stacks=True,
        has_shapes=True,
        notes=("5 ProfilerStep windows (#10..#14) are the steps window.",),
    )


def _manifest() -> Manifest:
    return Manifest(
        schema_version=1,
        gpudoctor_version="0.1.0",
        run_id="train-20261121-101500",
        command=("train.py", "--epochs", "1"),
        script=f"{CWD}/train.py",
        module=None,
        argv=("train.py", "--epochs", "1"),
        cwd=CWD,
        started_at="2026-11-21T10:15:00+01:00",
        started_at_unix_ns=1_795_252_500_000_000_000,
        ended_at="2026-11-21T10:15:42+01:00",
        duration_s=42.1,
        status=RunStatus.STOPPED,
        status_detail="stopped after 120 steps",
        exit_code=0,
        versions={"python": "3.11.7", "torch": "2.5.1+cu124", "cuda": "12.4", "driver": "550.54.15"},
        hostname="gpu-box",
        cpu_count=16,
        devices=(Device(0, "NVIDIA A100-SXM4-80GB", 85_899_345_920, "8.0", 108),),
        collected=(
            Collected("torch.profiler", True, detail="steps 5..14"),
            Collected("nvml", True),
            Collected("psutil", True),
        ),
        step_source="optimizer",
        steps_seen=120,
        max_steps=120,
        traces=("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"),
    )


def _steps() -> tuple[StepRecord, ...]:
    out = []
    t = 2_000_000_000
    for i in range(24):
        wall = (83 + (i % 5) - (12 if i == 0 else 0)) * MS + (40 * MS if i == 0 else 0)
        wait = (31 + (i % 3)) * MS
        out.append(StepRecord(i, t, wall, wait, gpu_ns=34 * MS, profiled=10 <= i < 15))
        t += wall
    return tuple(out)


def _samples() -> Samples:
    gpu = []
    proc = []
    for i in range(21):
        t = 2_000_000_000 + i * 100 * MS
        gpu.append(GpuSample(t, 0, util_pct=float((i * 37) % 100), mem_util_pct=float((i * 11) % 60),
                             mem_used_bytes=(2_000 + 200 * min(i, 10)) * (1 << 20), mem_total_bytes=80 * (1 << 30),
                             sm_clock_mhz=1410, power_w=180.0 + i, temp_c=55.0))
        proc.append(ProcessSample(t, 4242, "main", 99.0 - (i % 3), 3 * (1 << 30), 24))
    return Samples(process=tuple(proc), gpu=tuple(gpu), interval_ms=100.0, system_cpu_count=16)


def canonical_report() -> Report:
    return Report(
        schema_version=REPORT_SCHEMA_VERSION,
        gpudoctor_version="0.1.0",
        kind="profile",
        source=RUN_DIR,
        created_at="2026-11-21T10:15:43+01:00",
        findings=_findings(),
        checklist=_checklist(),
        summary=(
            SummaryStat("steps", "steps", 120),
            SummaryStat("step_time", "step time", 83.0, "ms", "23 steady steps"),
            SummaryStat("step_time_median", "step time, median (spread)", 81.5, "ms", "23 steady steps"),
            SummaryStat("data_wait_share", "waiting for data", 38.0, "%", "steps"),
            SummaryStat("gpu_idle", "GPU idle", 57.8, "%", "steps"),
            SummaryStat("peak_memory", "peak GPU memory", 6_442_450_944, "bytes"),
            SummaryStat("verified", "verified fixes", "1 confirmed, 0 refuted, 1 inconclusive, 1 not tried"),
        ),
        environment={
            "python": "3.11.7",
            "torch": "2.5.1+cu124",
            "CUDA": "12.4",
            "driver": "550.54.15",
            "GPU": "NVIDIA A100-SXM4-80GB (80.0 GiB, sm 8.0)",
            "host": "gpu-box, 16 CPUs",
        },
        run=RunData(
            source=RUN_DIR,
            manifest=_manifest(),
            steps=_steps(),
            samples=_samples(),
            metrics=(_metrics(0, 0.0), _metrics(1, 12.5)),
            notes=("profile.pstats: cProfile was off (--no-cprofile)",),
        ),
        ranks=(
            RankRow(0, 120, 83 * MS, 88 * MS, 12 * MS, 35.0, False, world_size=2, step_source="steps",
                    profiled_steps=5, comm_exposed_ns=29 * MS, work_median_ns=54 * MS, traces=("rank0.pt.trace.json.gz",)),
            RankRow(1, 120, 97 * MS, 104 * MS, 9 * MS, 20.0, True, world_size=2, step_source="steps",
                    profiled_steps=5, comm_exposed_ns=2 * MS, work_median_ns=81 * MS, traces=("rank1.pt.trace.json.gz",)),
        ),
        rank_summary=RankSummary(
            ranks=2, world_size=2, basis="work", compared_steps=5, step_median_ns=83 * MS, step_imbalance=1.08,
            work_imbalance=1.2, slowest_rank=1, slowest_excess_ns=27 * MS, slowest_excess_pct=32.5,
            slowest_in_steps=5, straggler_rank=1, notes=("2 of 2 ranks <all> compared",),
        ),
        account=_account(),
        errors=("GD502 memory-headroom crashed: KeyError('peak') (please report it)",),
        rules_run=("GD101", "GD104", "GD201", "GD301", "GD302", "GD401"),
        rules=_rules(),
    )


def empty_report() -> Report:
    """The least a report can be: no findings, no checklist, no run."""
    return Report(
        schema_version=REPORT_SCHEMA_VERSION,
        gpudoctor_version="0.1.0",
        kind="analyze",
        source="empty.pt.trace.json.gz",
        created_at="2026-11-21T10:00:00+00:00",
    )


XSS = "<script>alert(1)</script>"
NASTY_PATH = '/tmp/we"ird & <dir>/it\'s `x` | y/train.py'
CONTROLS = "kernel\x07bell\x1b[2J\u202egnp.exe"  # a bell, a clear-screen and a right-to-left override


def hostile_report() -> Report:
    """Untrusted strings everywhere: kernel names, paths, settings, messages, environment."""
    base = canonical_report()
    m = base.run.metrics[0]
    loc = Location(NASTY_PATH, 7, 3, XSS)
    kernels = m.kernels
    from dataclasses import replace

    kernels = replace(kernels, top=(NameStat(XSS, 3, 5 * MS, 2 * MS, 50.0), NameStat("a|b]]>&amp;`c`", 1, MS, MS, 10.0),
                                    NameStat(CONTROLS, 1, MS, MS, 10.0)))
    metrics = replace(
        m,
        path=NASTY_PATH + ".pt.trace.json.gz",
        kernels=kernels,
        cpu=replace(m.cpu, top_ops=(NameStat(f"aten::{XSS}", 2, 3 * MS, 2 * MS, 40.0),)),
        breakdown_mean_pct={**m.breakdown_mean_pct, XSS: 1.0},
    )
    finding = Finding(
        code="GD201",
        name="dataloader-stall",
        severity=Severity.ERROR,
        confidence=Confidence.MEASURED,
        message=f"kernel {XSS} & path {NASTY_PATH}\n# not a heading\n- not a list | not a cell",
        fix=Fix(instruction=f"Do not run {XSS}; see [link](javascript:alert(1))", before=f"x = '{XSS}'\n```\nbreakout", after="x = '&lt;'"),
        evidence=Evidence(
            metrics=(Metric(XSS, XSS, "%"),),
            settings=(SettingRef(f"DataLoader.{XSS}", XSS, loc),),
            notes=(f"@everyone {XSS} \x1b[31mred\x1b[0m",),
        ),
        gain=Gain(12.0, 1.14, XSS),
        location=loc,
    )
    return replace(
        base,
        source=NASTY_PATH,
        findings=(finding,),
        checklist=(ChecklistItem("x", f"title {XSS}", ChecklistStatus.RECOMMENDED, f"reason {NASTY_PATH}", (XSS,), Gain(1.0, 1.01)),),
        summary=(SummaryStat(XSS, XSS, XSS, "", XSS),),
        environment={XSS: NASTY_PATH},
        run=replace(base.run, source=NASTY_PATH, metrics=(metrics,)),
        errors=(XSS,),
        rules=(RuleInfo("GD201", "dataloader-stall", f"title {XSS}", f"doc {XSS} & {NASTY_PATH}"),),
        account=replace(
            base.account,
            headline=f"GPU idle {XSS} & | `x`",
            ledger=replace(base.account.ledger, label=NASTY_PATH, window=XSS,
                           slices=(*base.account.ledger.slices, LedgerSlice(XSS, MS, 0.2, "host", XSS, "trace"))),
            step_source=XSS,
            actions=(Action("GD201", XSS, 12.0, 10 * MS, None, (XSS,)),),
            notes=(f"@everyone {XSS}",),
        ),
    )

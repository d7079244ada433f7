"""Frozen dataclasses shared by every layer. Standard library only; imports nothing of ours."""

from __future__ import annotations

from gpudoctor.model._serde import from_dict, to_dict
from gpudoctor.model.findings import (
    REPORT_SCHEMA_VERSION,
    ChecklistItem,
    ChecklistStatus,
    Confidence,
    Evidence,
    Finding,
    Fix,
    Gain,
    Location,
    Metric,
    RankRow,
    Report,
    RunData,
    SettingRef,
    Severity,
    SummaryStat,
    TimeRange,
)
from gpudoctor.model.metrics import (
    Component,
    CpuSummary,
    DeviceInfo,
    DeviceUtilization,
    GapCause,
    GapCauseTotal,
    HistogramBin,
    HostSync,
    IdleGap,
    KernelStats,
    MemoryStats,
    NameStat,
    StepBreakdown,
    StepWindow,
    SyncSummary,
    TraceMetrics,
    TransferStat,
    Window,
    WindowKind,
)
from gpudoctor.model.run import (
    SCHEMA_VERSION,
    AutocastUse,
    CallSite,
    Collected,
    DataLoaderSetting,
    Device,
    ExceptionInfo,
    FlagSetting,
    GpuSample,
    Manifest,
    OptimizerSetting,
    ProcessSample,
    ProfilerSchedule,
    PstatsEntry,
    RunStatus,
    Samples,
    Settings,
    StepRecord,
    WrapSetting,
)

__all__ = [name for name in dir() if not name.startswith("_")]

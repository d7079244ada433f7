"""Frozen dataclasses shared by every layer. Standard library only; imports nothing of ours.

Every name below is importable from here (``from gpudoctor.model import Finding``); each
submodule is imported on first use of one of its names (PEP 562), so that a process that
needs only ``trace`` and ``metrics`` (the readers ``gpudoctor analyze`` starts before
anything else is imported) does not create the ~80 dataclasses of the rest (~50 ms).
``_NAMES`` says where each name lives; the ``TYPE_CHECKING`` block says the same for type
checkers, and a test keeps the two in step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES: dict[str, tuple[str, ...]] = {
    "_serde": (
        "from_dict", "to_dict",
    ),
    "compare": (
        "COMPARISON_SCHEMA_VERSION", "BreakdownChange", "Comparison", "ComponentChange", "FindingChange",
        "FindingStatus", "MetricChange", "RunSide", "SettingChange", "StepTimeChange", "StepTimes",
        "StepTimeVerdict",
    ),
    "findings": (
        "REPORT_SCHEMA_VERSION", "Account", "Action", "ChecklistItem", "ChecklistStatus", "Claim",
        "Confidence", "Edit", "Evidence", "Finding", "Fix", "Gain", "Location", "Metric", "RankRow", "RankSummary",
        "Report", "RuleInfo", "RunData", "SettingRef", "Severity", "SummaryStat", "TimeRange",
    ),
    "metrics": (
        "COMPONENT_LABELS", "DEVICE_COMPONENTS", "CommStats", "CompiledStats", "Component", "CpuSummary", "DeviceInfo",
        "DevicePeak", "DeviceUtilization", "DispatchStats", "GapCause", "GapCauseTotal", "HistogramBin", "HostSync",
        "IdleGap", "KernelStats", "Ledger", "LedgerSlice", "MemoryStats", "NameStat", "StepBreakdown",
        "Roofline", "RooflineRow", "StepComm", "StepWindow", "SyncSummary", "TraceMetrics",
        "TransferStat", "UtilizationBin", "Window", "WindowKind", "WindowWeight",
    ),
    "kinds": (
        "LedgerBasis", "SliceSource",
    ),
    "timelines": (
        "StepSpan", "Timelines",
    ),
    "run": (
        "SCHEMA_VERSION", "AppliedInjection", "AutocastUse", "CallSite", "Collected", "CompileEvent", "CompileState",
        "DataLoaderSetting",
        "Device", "ExceptionInfo", "FlagSetting", "GpuSample", "HostLoad", "HostSample", "Injection", "Manifest",
        "OptimizerSetting", "ProcessSample", "ProfilerSchedule", "PstatsEntry", "RankEnd", "RootModuleUse", "RunStatus",
        "Samples", "Settings", "StepMarker", "StepRecord", "WrapSetting", "WriteError", "status_text",
    ),
    "verify": (
        "LadderRung", "RunFigure", "Verification", "VerifyStatus",
    ),
}
_WHERE = {name: mod for mod, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    mod = _WHERE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value  # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


if TYPE_CHECKING:
    from gpudoctor.model._serde import (
        from_dict,
        to_dict,
    )
    from gpudoctor.model.compare import (
        COMPARISON_SCHEMA_VERSION,
        BreakdownChange,
        Comparison,
        ComponentChange,
        FindingChange,
        FindingStatus,
        MetricChange,
        RunSide,
        SettingChange,
        StepTimeChange,
        StepTimes,
        StepTimeVerdict,
    )
    from gpudoctor.model.findings import (
        REPORT_SCHEMA_VERSION,
        Account,
        Action,
        ChecklistItem,
        ChecklistStatus,
        Claim,
        Confidence,
        Edit,
        Evidence,
        Finding,
        Fix,
        Gain,
        Location,
        Metric,
        RankRow,
        RankSummary,
        Report,
        RuleInfo,
        RunData,
        SettingRef,
        Severity,
        SummaryStat,
        TimeRange,
    )
    from gpudoctor.model.kinds import (
        LedgerBasis,
        SliceSource,
    )
    from gpudoctor.model.metrics import (
        COMPONENT_LABELS,
        DEVICE_COMPONENTS,
        CommStats,
        CompiledStats,
        Component,
        CpuSummary,
        DeviceInfo,
        DevicePeak,
        DeviceUtilization,
        DispatchStats,
        GapCause,
        GapCauseTotal,
        HistogramBin,
        HostSync,
        IdleGap,
        KernelStats,
        Ledger,
        LedgerSlice,
        MemoryStats,
        NameStat,
        Roofline,
        RooflineRow,
        StepBreakdown,
        StepComm,
        StepWindow,
        SyncSummary,
        TraceMetrics,
        TransferStat,
        UtilizationBin,
        Window,
        WindowKind,
        WindowWeight,
    )
    from gpudoctor.model.run import (
        SCHEMA_VERSION,
        AppliedInjection,
        AutocastUse,
        CallSite,
        Collected,
        CompileEvent,
        CompileState,
        DataLoaderSetting,
        Device,
        ExceptionInfo,
        FlagSetting,
        GpuSample,
        HostLoad,
        HostSample,
        Injection,
        Manifest,
        OptimizerSetting,
        ProcessSample,
        ProfilerSchedule,
        PstatsEntry,
        RankEnd,
        RootModuleUse,
        RunStatus,
        Samples,
        Settings,
        StepMarker,
        StepRecord,
        WrapSetting,
        WriteError,
        status_text,
    )
    from gpudoctor.model.timelines import StepSpan, Timelines
    from gpudoctor.model.verify import (
        LadderRung,
        RunFigure,
        Verification,
        VerifyStatus,
    )

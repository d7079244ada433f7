"""The checklist of a ``check`` report: each technique, as the source code shows it.

The items are the engine's (``gpudoctor.rules.checklist.TECHNIQUES``: the 13
techniques of the seed checklist, then one item per rule they leave out, keyed by
the rule's name), so that a ``check`` report and a ``profile`` report list the same
keys with the same titles. Only the way each status is decided differs: here from
the source code, with the reason naming the ``file:line`` that shows it.
"""

from __future__ import annotations

from gpudoctor.model.findings import ChecklistItem, ChecklistStatus, Finding, Gain
from gpudoctor.rules.checklist import TECHNIQUES
from gpudoctor.rules.registry import all_rules
from gpudoctor.static.checks import STATIC_CODES

_STATIC_NOTE = "not measured: `gpudoctor profile` puts it in step time"

A = ChecklistStatus.APPLIED
R = ChecklistStatus.RECOMMENDED
NA = ChecklistStatus.NOT_APPLICABLE
NM = ChecklistStatus.NOT_MEASURABLE


def checklist_rows() -> list[tuple[str, str, int | None, tuple[str, ...]]]:
    """(key, title, technique number, codes) of every item, in the engine's order."""
    rows: list[tuple[str, str, int | None, tuple[str, ...]]] = [
        (t.key, t.title, t.number, t.codes) for t in TECHNIQUES
    ]
    covered = {c for t in TECHNIQUES for c in t.codes}
    rows += [(r.name, r.technique or r.title, None, (r.code,)) for r in all_rules() if r.code not in covered]
    return rows


def _first(locs) -> str:
    items = [f"{x.file}:{x.line}" if hasattr(x, "line") else str(x) for x in locs]
    if not items:
        return ""
    return items[0] + (f" and {len(items) - 1} more" if len(items) > 1 else "")


def build_checklist(obs, findings: tuple[Finding, ...], enabled) -> tuple[ChecklistItem, ...]:
    """One item per checklist row. ``obs`` is ``checks.Observations``; ``enabled(code)`` says
    whether a code runs under the configuration."""
    fired: dict[str, list[Finding]] = {}
    for f in findings:
        fired.setdefault(f.code, []).append(f)
    items: list[ChecklistItem] = []
    for key, title, technique, codes in checklist_rows():
        status, reason = _judge(key, obs, fired, codes, enabled)
        gain = Gain(None, None, _STATIC_NOTE) if status is R else None
        items.append(ChecklistItem(key, title, status, reason, codes, gain, technique))
    return tuple(items)


def _judge(key: str, obs, fired, codes, enabled) -> tuple[ChecklistStatus, str]:
    hits = [f for c in codes for f in fired.get(c, [])]
    if key == "amp":  # the deprecated-spelling finding does not make AMP missing
        hits = [f for f in hits if "deprecated" not in f.message]
    if hits:
        first = hits[0]
        more = f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        return R, f"{first.code}: {first.message}{more}"
    static_codes = [c for c in codes if c in STATIC_CODES]
    if static_codes and not any(enabled(c) for c in static_codes):
        return NM, f"{', '.join(static_codes)} disabled by the rule selection"
    judge = _JUDGES.get(key)
    if judge is None:
        runtime = ", ".join(codes) or "it"
        return NM, f"a run-time measurement: {runtime} needs `gpudoctor profile`"
    return judge(obs)


_NO_CUDA = "no CUDA device in the checked source"
_NO_LOADER = "no DataLoader in the checked source"


def _pinned(obs) -> tuple[ChecklistStatus, str]:
    if not obs.loaders:
        return NA, _NO_LOADER
    if not obs.cuda:
        return NA, _NO_CUDA
    if obs.pinned:
        copies = (
            f"; all {obs.transfers} batch copies in training steps pass non_blocking=True"
            if obs.transfers and obs.transfers_non_blocking == obs.transfers
            else ""
        )
        return A, f"pin_memory=True at {_first(obs.pinned)}{copies}"
    return NM, "pin_memory is decided at run time, or no batch goes to the GPU in the checked code"


def _workers(obs) -> tuple[ChecklistStatus, str]:
    if not obs.loaders:
        return NA, _NO_LOADER
    shown = "; ".join(f"num_workers={s['num_workers']} at {_first([loc])}" for loc, s in obs.loaders[:3])
    values = [s["num_workers"] for _loc, s in obs.loaders]
    if all(not v.startswith(("0", "set", "decided")) for v in values):
        return A, shown
    if any(v.startswith("0") for v in values):
        return NA, shown + ": the dataset is a TensorDataset in memory, or the loader is not used by default"
    return NM, shown + " (computed at run time)"


def _prefetch(obs) -> tuple[ChecklistStatus, str]:
    if not obs.loaders:
        return NA, _NO_LOADER
    with_workers = [(loc, s) for loc, s in obs.loaders if not s["num_workers"].startswith("0")]
    if not with_workers:
        return NA, "num_workers=0: prefetching starts with workers (see num_workers > 0 above)"
    loc, s = with_workers[0]
    return A, f"prefetch_factor={s['prefetch_factor']} per worker at {_first([loc])}; raise it if load times vary"


def _batch_size(obs) -> tuple[ChecklistStatus, str]:
    found = "; ".join(obs.batch_sizes[:3])
    return NM, (found + ": " if found else "") + "whether it fills the GPU needs its memory use (GD104, `gpudoctor profile`)"


def _cudnn(obs) -> tuple[ChecklistStatus, str]:
    if obs.benchmark_on:
        return A, f"cudnn.benchmark set at {_first(obs.benchmark_on)}"
    if obs.deterministic:
        return NA, f"deterministic algorithms requested at {_first(obs.deterministic)}"
    if not obs.conv:
        return NA, "no convolution layers in the checked source"
    if not obs.cuda:
        return NA, _NO_CUDA
    return NM, "convolutions found but no CUDA training loop in the checked code"


def _no_grad(obs) -> tuple[ChecklistStatus, str]:
    if obs.eval_loops:
        return A, (
            f"{obs.eval_loops_guarded} of {len(obs.eval_loops)} evaluation loops run under no_grad / "
            f"inference_mode ({_first(obs.eval_loops)})"
        )
    return NA, "no evaluation loop (model.eval() then forward passes without backward) in the checked source"


def _compile(obs) -> tuple[ChecklistStatus, str]:
    if obs.compile:
        return A, f"torch.compile at {_first(obs.compile)}"
    return NM, "torch.compile not used; what kernel fusion wins shows only once compiled: compare two runs"


def _amp(obs) -> tuple[ChecklistStatus, str]:
    tf32 = f"; TF32 enabled at {_first(obs.tf32)}" if obs.tf32 else ""
    if obs.autocast:
        return A, f"autocast / reduced precision at {_first(obs.autocast)}{tf32}"
    if not obs.cuda:
        return NA, _NO_CUDA
    if not obs.step_loops:
        return NA, "no training loop in the checked source"
    return NM, "no autocast found, and no CUDA training loop for GD401 to judge" + tf32


def _torchscript(obs) -> tuple[ChecklistStatus, str]:
    if obs.jit:
        return A, f"TorchScript at {_first(obs.jit)}; torch.compile supersedes it for training"
    return NA, "TorchScript is in maintenance: for speed, torch.compile replaces it"


def _host_sync(obs) -> tuple[ChecklistStatus, str]:
    if not obs.step_loops:
        return NA, "no training loop in the checked source"
    if not obs.cuda:
        return NA, _NO_CUDA
    return A, f"no per-step .item() / print(tensor) / float(tensor) in the training loop at {_first(obs.step_loops)}"


def _d2h(obs) -> tuple[ChecklistStatus, str]:
    if not obs.step_loops:
        return NA, "no training loop in the checked source"
    if not obs.cuda:
        return NA, _NO_CUDA
    return A, f"no per-step .cpu() / .numpy() / .tolist() in the training loop at {_first(obs.step_loops)}"


def _optimizer(obs) -> tuple[ChecklistStatus, str]:
    if not obs.optimizers:
        return NA, "no torch.optim optimizer in the checked source"
    if not obs.cuda:
        return NA, _NO_CUDA
    loc, shown = obs.optimizers[0]
    return A, f"{shown} at {_first([loc])}: foreach (the CUDA default) or fused"


def _allocator(obs) -> tuple[ChecklistStatus, str]:
    if not obs.cuda:
        return NA, _NO_CUDA
    return A, "no torch.cuda.empty_cache() in a loop"


def _data_parallel(obs) -> tuple[ChecklistStatus, str]:
    if obs.ddp:
        return A, f"DistributedDataParallel / FSDP at {_first(obs.ddp)}"
    return NA, "no nn.DataParallel in the checked source"


_JUDGES = {
    "pinned-memory": _pinned,
    "dataloader-workers": _workers,
    "batch-size": _batch_size,
    "cudnn-benchmark": _cudnn,
    "loss-on-device": lambda obs: (NM, "where the loss runs is decided by tensor placement at run time (GD702 needs `gpudoctor profile`)"),
    "no-grad-eval": _no_grad,
    "profiler": lambda obs: (NM, "a static check does not run the script: `gpudoctor profile SCRIPT` records torch.profiler traces"),
    "prefetch": _prefetch,
    "torch-compile": _compile,
    "amp": _amp,
    "torchscript": _torchscript,
    "gpu-monitoring": lambda obs: (NM, "a run-time measurement: `gpudoctor profile` samples NVML during the run"),
    "cpu-bottlenecks": lambda obs: (NM, "needs CPU samples of a run (GD203, GD204, GD503: `gpudoctor profile`)"),
    "host-sync": _host_sync,
    "d2h-every-step": _d2h,
    "unfused-optimizer": _optimizer,
    "allocator-churn": _allocator,
    "data-parallel": _data_parallel,
}

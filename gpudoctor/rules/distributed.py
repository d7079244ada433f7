"""What the distributed rules (GD602–GD605) share: DDP settings, collectives per rank, rank figures."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from gpudoctor.analysis.ranks import RankFigures, rank_figures
from gpudoctor.model.findings import SettingRef
from gpudoctor.model.metrics import CommStats, TraceMetrics
from gpudoctor.model.run import WrapSetting
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.formatting import location_of

DDP_KINDS = ("DistributedDataParallel", "FullyShardedDataParallel")


def ddp_wrappers(ctx: RuleContext) -> tuple[WrapSetting, ...]:
    s = ctx.settings
    return tuple(w for w in s.wrappers if w.kind in DDP_KINDS) if s is not None else ()


def ddp_refs(w: WrapSetting, *keys: str) -> tuple[SettingRef, ...]:
    loc = location_of(w.call_site)
    return tuple(SettingRef(f"{w.kind}.{k}", w.options.get(k), loc) for k in keys if k in w.options)


def is_distributed(ctx: RuleContext) -> bool:
    """Several processes in one job: a world size above 1 anywhere, or a DDP wrapper."""
    mf = ctx.manifest
    if mf is not None and (mf.world_size or 0) > 1:
        return True
    if any((m.world_size or 0) > 1 for m in ctx.metrics) or any(s.rank is not None for s in ctx.run.steps):
        return True
    return any((w.options.get("world_size") or 0) > 1 for w in ddp_wrappers(ctx))


def figures(ctx: RuleContext) -> RankFigures:
    t = ctx.thresholds
    return rank_figures(
        ctx.run,
        ctx.figures,
        delay_share_pct=t.straggler_delay_share_pct,
        consistency_pct=t.straggler_consistency_pct,
        min_steps=t.straggler_min_steps,
        jitter_ratio=t.straggler_excess_to_jitter_ratio,
    )


def main_comm(m: TraceMetrics) -> CommStats | None:
    """The collectives a trace is judged by: the device with the most communication."""
    pool = [c for c in m.comm if c.comm_ns > 0 or c.host_ns > 0]
    if not pool:
        return None
    return max(pool, key=lambda c: (c.comm_ns, c.host_ns, -c.device))


@dataclass(frozen=True, slots=True)
class RankComm:
    """One rank's collectives over its profiled windows (all its traces together)."""

    rank: int | None  # None: a trace without a rank (judged on its own)
    world_size: int | None
    label: str  # "rank 3" or the trace's file name
    comm_ns: int
    exposed_ns: int
    window_ns: int  # the step windows (or the analysis window) the times are of
    window: str  # "steps" or the window's kind
    steps: int  # profiled steps
    names: tuple[str, ...]  # the collectives, most time first
    device: int  # -1: host-side (gloo) collectives
    traces: tuple[TraceMetrics, ...]

    @property
    def exposed_pct(self) -> float | None:
        return 100.0 * self.exposed_ns / self.window_ns if self.window_ns > 0 else None

    @property
    def overlap_pct(self) -> float | None:
        return 100.0 * (self.comm_ns - self.exposed_ns) / self.comm_ns if self.comm_ns > 0 else None


def comm_by_rank(ctx: RuleContext) -> list[RankComm]:
    """Collectives per rank (traces of one rank summed), for every trace with collectives."""
    groups: dict[tuple, list[tuple[TraceMetrics, CommStats]]] = defaultdict(list)
    for m in ctx.metrics:
        c = main_comm(m)
        if c is None:
            continue
        key = ("rank", m.world_size, m.rank) if m.rank is not None else ("trace", m.path)
        groups[key].append((m, c))
    out: list[RankComm] = []
    for items in groups.values():
        comm = exposed = window = steps = 0
        names: dict[str, int] = defaultdict(int)
        label_kind = "steps"
        for m, c in items:
            if c.per_step:
                comm += sum(p.comm_ns for p in c.per_step)
                exposed += sum(p.exposed_ns for p in c.per_step)
                window += sum(p.dur_ns for p in c.per_step)
                steps += len(c.per_step)
            else:
                w = ctx.window(m)
                comm += c.comm_ns
                exposed += c.exposed_ns
                window += w.dur_ns if w is not None else 0
                label_kind = ctx.window_label(w)
            for n in c.top:
                names[n.name] += n.total_ns
        m0 = items[0][0]
        label = f"rank {m0.rank}" if m0.rank is not None else m0.path.replace("\\", "/").rsplit("/", 1)[-1]
        out.append(
            RankComm(
                rank=m0.rank,
                world_size=m0.world_size,
                label=label,
                comm_ns=comm,
                exposed_ns=exposed,
                window_ns=window,
                window=label_kind,
                steps=steps,
                names=tuple(sorted(names, key=lambda n: -names[n])),
                device=items[0][1].device,
                traces=tuple(m for m, _ in items),
            )
        )
    out.sort(key=lambda r: (r.world_size is None, r.world_size or 0, r.rank is None, r.rank or 0, r.label))
    return out


def cuda_backend(backend: str) -> str:
    """The backend collectives on CUDA tensors use: ``"cpu:gloo,cuda:nccl"`` → ``"nccl"``."""
    text = backend.strip().lower()
    if ":" not in text:
        return text
    for part in text.split(","):
        dev, _, name = part.partition(":")
        if dev.strip() == "cuda":
            return name.strip()
    return ""

"""Distributed profiling: the job starts through PyTorch's own launcher, one gpudoctor child per rank.

``gpudoctor profile --nproc-per-node N [--nnodes M --node-rank R --rdzv-endpoint HOST:PORT
--master-port P] train.py args`` runs::

    python -m torch.distributed.run <those options> -m gpudoctor.collect._child

so torchrun (``torch.distributed.run``) does what it always does (rendezvous, ``RANK`` /
``LOCAL_RANK`` / ``WORLD_SIZE``, restarts, tearing the group down when a rank fails) and
each rank it starts is gpudoctor's child bootstrap, which runs the script under the
instruments and writes rank-tagged files (``steps.rank3.jsonl`` …) into the one run
directory. The parent samples the launcher, every rank and their workers, and at the end
merges the ranks' accounts (``.child-state.rank<R>.json``) into one manifest: how each
rank ended (``Manifest.rank_ends``), which one failed first (``failed_rank``), and the
job's status.

On one node without ``--rdzv-endpoint``, the rendezvous is local (torchrun
``--standalone``, a free port) unless ``--master-port`` fixes the port. On several nodes,
each node runs its own ``gpudoctor profile`` with the same ``--rdzv-endpoint`` (torchrun's
c10d rendezvous) and writes its own run directory; ``gpudoctor analyze DIR_A DIR_B …``
merges them into one job.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import Any

from gpudoctor.collect import rundir
from gpudoctor.errors import UsageError
from gpudoctor.model import Collected, ExceptionInfo, RankEnd, RunStatus, layout

TORCHRUN_MODULE = "torch.distributed.run"
LAUNCHER = "torchrun"
_NNODES = re.compile(r"^\d+(:\d+)?$")


def is_distributed(opts: Any) -> bool:
    return any(
        getattr(opts, k) is not None for k in ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "master_port")
    )


def _nnodes_max(nnodes: str | None) -> int:
    if nnodes is None:
        return 1
    return int(nnodes.split(":")[-1])


def validate(opts: Any) -> None:
    """The torchrun options make sense together; ``UsageError`` says what to change."""
    if opts.nproc_per_node is None:
        raise UsageError(
            "--nnodes, --node-rank, --rdzv-endpoint and --master-port go with --nproc-per-node N "
            "(the ranks to start on this node): gpudoctor profile --nproc-per-node 4 train.py"
        )
    if opts.nproc_per_node < 1:
        raise UsageError("--nproc-per-node must be at least 1")
    if opts.nnodes is not None and not _NNODES.match(str(opts.nnodes).strip()):
        raise UsageError(f"--nnodes {opts.nnodes!r}: expected a number of nodes (2) or a range (1:4), as torchrun takes it")
    if opts.nnodes is not None:
        lo, _, hi = str(opts.nnodes).partition(":")
        if int(lo) < 1 or (hi and int(hi) < int(lo)):
            raise UsageError(f"--nnodes {opts.nnodes!r}: give at least 1 node (MIN:MAX with MIN <= MAX)")
    if opts.node_rank is not None and opts.node_rank < 0:
        raise UsageError("--node-rank cannot be negative")
    if opts.master_port is not None and not 1 <= opts.master_port <= 65535:
        raise UsageError(f"--master-port {opts.master_port}: give a TCP port between 1 and 65535")
    if opts.rdzv_endpoint is not None:
        host, sep, port = str(opts.rdzv_endpoint).rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise UsageError(
                f"--rdzv-endpoint {opts.rdzv_endpoint!r}: expected HOST:PORT of the rendezvous (node 0), e.g. node0:29400"
            )
    multi = _nnodes_max(opts.nnodes) > 1
    if multi and opts.rdzv_endpoint is None:
        raise UsageError(
            f"--nnodes {opts.nnodes}: several nodes need --rdzv-endpoint HOST:PORT (the same on every node, "
            "e.g. node0:29400); run gpudoctor profile on each node"
        )
    if opts.node_rank is not None and not multi:
        raise UsageError("--node-rank goes with --nnodes above 1 (one gpudoctor profile per node)")


def torchrun_args(opts: Any) -> list[str]:
    """torchrun's options for ``opts`` (see the module docstring)."""
    args = [f"--nproc-per-node={opts.nproc_per_node}"]
    if opts.rdzv_endpoint is not None:
        args += [f"--nnodes={opts.nnodes or 1}", "--rdzv-backend=c10d", f"--rdzv-endpoint={opts.rdzv_endpoint}"]
        if opts.node_rank is not None:
            args.append(f"--node-rank={opts.node_rank}")
        if opts.master_port is not None:
            args.append(f"--master-port={opts.master_port}")
    elif opts.master_port is not None:
        args += ["--nnodes=1", "--master-addr=127.0.0.1", f"--master-port={opts.master_port}"]
    else:
        args.append("--standalone")
    return args


def launch_argv(opts: Any, child_module: str, flags: list[str] | None = None) -> list[str]:
    """``python -m torch.distributed.run … -m gpudoctor.collect._child``."""
    return [sys.executable, *(flags or []), "-m", TORCHRUN_MODULE, *torchrun_args(opts), "-m", child_module]


def die_with_parent_preexec() -> None:
    """``Popen(preexec_fn=…)`` for the launcher (Linux): SIGTERM when gpudoctor's process dies, so
    torchrun tears the ranks down instead of running on as orphans."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes  # noqa: PLC0415

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------- the ranks' accounts


def read_rank_states(run_dir: Path, remove: bool = True) -> dict[int, dict[str, Any]]:
    """Every rank's ``.child-state.rank<R>.json`` (removed once read when ``remove``)."""
    states: dict[int, dict[str, Any]] = {}
    for p in sorted(run_dir.iterdir()):
        rank = layout.rank_of(p.name, layout.CHILD_STATE)
        if rank is None:
            continue
        data = rundir.read_json(p)
        if isinstance(data, dict):
            states[rank] = data
        if remove:
            try:
                p.unlink()
            except OSError:
                pass
    return states


def rank_steps_files(run_dir: Path) -> dict[int, Path]:
    out = {}
    for p in run_dir.glob(layout.rank_glob(layout.STEPS)):
        rank = layout.rank_of(p.name, layout.STEPS)
        if rank is not None:
            out[rank] = p
    return out


def first_rank_steps(run_dir: Path) -> Path | None:
    files = rank_steps_files(run_dir)
    return files[min(files)] if files else None


def _exception(state: dict[str, Any]) -> ExceptionInfo | None:
    exc = state.get("exception")
    if isinstance(exc, dict):
        try:
            return ExceptionInfo.from_dict(exc)
        except (TypeError, ValueError, KeyError):
            return None
    return None


def rank_ends(states: dict[int, dict[str, Any]], steps_lines: dict[int, int], world_size: int | None,
              local_ranks: int | None) -> list[RankEnd]:
    """How each rank of this node ended; a rank with no account is ``running`` (never reported)."""
    ends: list[RankEnd] = []
    for rank, st in sorted(states.items()):
        status = st.get("status") or RunStatus.RUNNING.value
        try:
            status_v = RunStatus(status)
        except ValueError:
            status_v = RunStatus.RUNNING
        ends.append(
            RankEnd(
                rank=rank,
                local_rank=st.get("local_rank"),
                pid=st.get("pid"),
                status=status_v,
                status_detail=str(st.get("status_detail") or ""),
                exit_code=st.get("exit_code"),
                signal=st.get("signal"),
                exception=_exception(st),
                ended_ns=st.get("ended_ns"),
                steps_seen=max(int(st.get("steps_seen") or 0), steps_lines.get(rank, 0)),
                traces=tuple(t for t in st.get("traces", []) or [] if isinstance(t, str)),
            )
        )
    return ends


def _order(e: RankEnd) -> tuple[int, int]:
    return (e.ended_ns if e.ended_ns is not None else 1 << 62, e.rank)


def job_outcome(ends: list[RankEnd], expected: int | None) -> dict[str, Any]:
    """The job's account for the manifest, as a child state would give it: status, detail,
    exception, signal, failed rank (the first rank that failed: the root cause)."""
    out: dict[str, Any] = {}
    if not ends:
        return out
    failed = sorted((e for e in ends if e.status == RunStatus.FAILED), key=_order)
    killed = [e for e in ends if e.status in (RunStatus.KILLED, RunStatus.INTERRUPTED)]
    silent = [e for e in ends if e.status == RunStatus.RUNNING]
    missing = max(0, (expected or 0) - len(ends))
    if failed:
        root = failed[0]
        others = [e for e in ends if e is not root and e.status != RunStatus.COMPLETED and e.status != RunStatus.STOPPED]
        detail = f"rank {root.rank} failed: {root.status_detail or 'exit code ' + str(root.exit_code)}"
        if others:
            how = "; ".join(f"rank {e.rank} {_short(e)}" for e in sorted(others, key=lambda e: e.rank))
            detail += f"; then {how}"
        out.update(status=RunStatus.FAILED.value, status_detail=detail, failed_rank=root.rank,
                   exception=root.exception.to_dict() if root.exception else None)
    elif killed:
        first = sorted(killed, key=_order)[0]
        status = RunStatus.INTERRUPTED if all(e.status == RunStatus.INTERRUPTED for e in killed) else RunStatus.KILLED
        ranks = ", ".join(str(e.rank) for e in sorted(killed, key=lambda e: e.rank))
        out.update(status=status.value, status_detail=f"rank(s) {ranks}: {first.status_detail}", signal=first.signal,
                   failed_rank=first.rank if status == RunStatus.KILLED else None)
    elif silent:
        first = silent[0]
        out.update(status=RunStatus.RUNNING.value, failed_rank=first.rank)
    elif any(e.status == RunStatus.STOPPED for e in ends):
        stopped = next(e for e in ends if e.status == RunStatus.STOPPED)
        out.update(status=RunStatus.STOPPED.value, status_detail=stopped.status_detail + f" (each of {len(ends)} ranks)")
    else:
        out.update(status=RunStatus.COMPLETED.value, status_detail="")
    if silent and "status" in out and out["status"] != RunStatus.RUNNING.value:
        ranks = ", ".join(str(e.rank) for e in silent)
        out["status_detail"] += f"; rank(s) {ranks} never reported how they ended (killed outright)"
    if missing:
        out["status_detail"] = (out.get("status_detail") or "") + f"; {missing} rank(s) of this node left no account"
    return out


def _short(e: RankEnd) -> str:
    if e.status == RunStatus.FAILED:
        if e.exception is not None:
            msg = " ".join(e.exception.message.split())
            msg = msg if len(msg) <= 80 else msg[:77] + "…"
            return f"failed too ({e.exception.type}: {msg})"
        return f"failed too ({e.status_detail})" if e.status_detail else "failed too"
    if e.status == RunStatus.KILLED:
        return "was terminated by the launcher" if e.signal == signal.SIGTERM else e.status_detail or "was killed"
    if e.status == RunStatus.RUNNING:
        return "never reported (killed outright)"
    return e.status.value + (f" ({e.status_detail})" if e.status_detail else "")


def merge_collected(states: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``collected`` entry per instrument for the job: ok on every rank, else why not, by rank."""
    by_name: dict[str, list[tuple[int, Collected]]] = {}
    for rank, st in sorted(states.items()):
        for c in st.get("collected", []) or []:
            try:
                col = Collected.from_dict(c)
            except (TypeError, ValueError, KeyError):
                continue
            by_name.setdefault(col.name, []).append((rank, col))
    out = []
    n = len(states)
    for name, items in by_name.items():
        bad = [(r, c) for r, c in items if not c.ok]
        first_rank, first = items[0]
        every = f"every one of the {n} ranks" if len(items) == n else f"{len(items)} of {n} ranks"
        if not bad:
            detail = f"{first.detail} (rank {first_rank}; {every})" if first.detail else every
            out.append(Collected(name, True, "", detail if n > 1 else first.detail).to_dict())
            continue
        reasons = {c.reason for _, c in bad}
        if len(reasons) == 1 and len(bad) == len(items):
            reason = bad[0][1].reason + (f" ({every})" if n > 1 else "")
        else:
            reason = "; ".join(f"rank {r}: {c.reason}" for r, c in bad[:8])
        ok_ranks = [r for r, c in items if c.ok]
        detail = f"ok on rank(s) {', '.join(map(str, ok_ranks))}" if ok_ranks else ""
        out.append(Collected(name, bool(ok_ranks), reason, detail).to_dict())
    return out


def combined_state(run_dir: Path, expected_ranks: int | None) -> tuple[dict[str, Any], list[RankEnd], dict[str, Any]]:
    """(a child state for the whole job, each rank's end, the job outcome) from the rank files."""
    for p in rank_steps_files(run_dir).values():
        rundir.repair_jsonl(p)
    steps_lines = {r: len(rundir.read_jsonl(p)) for r, p in rank_steps_files(run_dir).items()}
    states = read_rank_states(run_dir)
    ends = rank_ends(states, steps_lines, None, expected_ranks)
    outcome = job_outcome(ends, expected_ranks)
    lowest = states[min(states)] if states else {}
    world = max((int(s.get("world_size") or 0) for s in states.values()), default=0) or None
    traces: list[str] = []
    notes: list[str] = []
    versions: dict[str, str] = {}
    for rank, st in sorted(states.items()):
        traces += [t for t in st.get("traces", []) or [] if isinstance(t, str) and t not in traces]
        notes += [f"rank {rank}: {n}" for n in st.get("notes", []) or []]
        versions.update({k: str(v) for k, v in (st.get("versions") or {}).items()})
    state: dict[str, Any] = {
        "status": outcome.get("status"),
        "status_detail": outcome.get("status_detail", ""),
        "exception": outcome.get("exception"),
        "signal": outcome.get("signal"),
        "collected": merge_collected(states),
        "notes": notes,
        "versions": versions,
        "cuda_devices": lowest.get("cuda_devices") or [],
        "traces": traces,
        "profiler_owner": lowest.get("profiler_owner", "gpudoctor"),
        "step_source": lowest.get("step_source"),
        "step_source_reason": lowest.get("step_source_reason"),
        "step_markers": lowest.get("step_markers"),
        "time_window_s": lowest.get("time_window_s"),
        "root_module": lowest.get("root_module"),
        "steps_seen": max((e.steps_seen for e in ends), default=0),
        "argv": lowest.get("argv"),
        "rank": None,
        "world_size": world,
        "write_errors": [e for _, st in sorted(states.items()) for e in st.get("write_errors") or [] if isinstance(e, dict)],
    }
    return state, ends, outcome

"""One node's torchrun ranks, each running ``gpudoctor.session()`` (a trainer callback on every rank), share one
run directory in ``gpudoctor profile --nproc-per-node``'s layout (docs/run-directory.md, "Distributed runs").

The first rank to start its session creates the directory and publishes its name and the job's clock in a
hidden file beside it (:class:`JobDir`); the others join it. Every rank's child writes its rank-tagged files
there; the first rank (the *leader*) takes the part ``profile``'s parent process takes: it samples the launcher
and every rank under it (:func:`job_sampler`), compresses the traces, and at its end waits for the other ranks'
accounts and writes the job's manifest (``collect.inprocess``).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from gpudoctor.collect import rundir
from gpudoctor.collect.options import ProfileOptions
from gpudoctor.model import RunStatus, layout

JOB_WAIT_S = 60.0  # how long the leader waits at its end for the other ranks' accounts (ranks end together)
_sessions = [0]  # sessions started in this process: the n-th of each rank is the same job's


def launched_rank() -> tuple[int, int] | None:
    """(rank, ranks on this node) when this process is a rank of a torchrun / accelerate launch job."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        rank = int(os.environ.get("RANK", "0") or 0)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "") or world)
    except ValueError:
        return None
    if world <= 1 or "LOCAL_RANK" not in os.environ:
        return None
    return rank, local_world


class JobDir:
    """One node's ranks agree on one run directory: the first to come creates it and publishes its name (and
    the job's clock) in ``.gpudoctor-job-<host>-<launcher pid>-<job id>-<restart>-<n>.json`` beside it, by a
    hard link (atomic: a rank reads the whole file or none); the others read it. ``leader``: this rank created
    it."""

    def __init__(self, out_dir: Path, stem: str, t0_unix_ns: int, t0_mono_ns: int) -> None:
        env = os.environ
        key = "-".join(rundir.run_stem(part, None) for part in (  # one node's (a shared file system holds several)
            socket.gethostname(), str(os.getppid()), env.get("TORCHELASTIC_RUN_ID", "") or env.get("MASTER_PORT", "") or "job",
            env.get("TORCHELASTIC_RESTART_COUNT", "0") or "0", str(_sessions[0])))
        self.path = out_dir / f".gpudoctor-job-{key}.json"
        self.leader = False
        found = rundir.read_json(self.path)
        if not isinstance(found, dict):
            run_dir = rundir.create_run_dir(out_dir, stem)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}{rundir.TMP_SUFFIX}")
            tmp.write_text(json.dumps({"run_dir": run_dir.name, "t0_unix_ns": t0_unix_ns, "t0_mono_ns": t0_mono_ns}),
                           encoding="utf-8")
            try:
                os.link(tmp, self.path)
                self.leader = True
            except FileExistsError:  # another rank came first
                run_dir.rmdir()
            finally:
                tmp.unlink()
            found = {"run_dir": run_dir.name, "t0_unix_ns": t0_unix_ns, "t0_mono_ns": t0_mono_ns} if self.leader \
                else rundir.read_json(self.path)
        if not isinstance(found, dict) or not isinstance(found.get("run_dir"), str) \
                or not all(isinstance(found.get(k), int) for k in ("t0_unix_ns", "t0_mono_ns")):
            raise OSError(f"{self.path} does not name the job's run directory")
        _sessions[0] += 1
        self.run_dir = out_dir / Path(found["run_dir"]).name
        self.t0_unix_ns, self.t0_mono_ns = int(found["t0_unix_ns"]), int(found["t0_mono_ns"])

    def wait_for_ranks(self, timeout_s: float = JOB_WAIT_S) -> int:
        """Until every rank that joined (each wrote its account when its session started) says how it ended,
        or ``timeout_s`` (those that did not are ``running`` in the manifest's ``rank_ends``); the ranks."""
        deadline = time.monotonic() + timeout_s
        while True:
            paths = list(self.run_dir.glob(layout.rank_glob(layout.CHILD_STATE)))
            states = [rundir.read_json(p) for p in paths]
            if time.monotonic() >= deadline or all(
                    isinstance(st, dict) and st.get("status") not in (None, RunStatus.RUNNING.value) for st in states):
                return len(paths)
            time.sleep(0.05)

    def close(self) -> None:
        try:
            self.path.unlink()
        except OSError:
            pass


def job_sampler(opts: ProfileOptions, run_dir: Path, t0_mono_ns: int) -> tuple[Any, Any, str]:
    """The NVML/psutil sampler of a torchrun job, as ``profile``'s: rooted at the launcher (this rank's
    parent), each process under it that runs the script a rank ("main", with its ``RANK``)."""
    from gpudoctor.collect.nvml import Nvml  # noqa: PLC0415
    from gpudoctor.collect.sampler import Sampler  # noqa: PLC0415

    nvml, reason = Nvml.open()
    sampler = Sampler(run_dir / layout.SAMPLES, t0_mono_ns, opts.sample_interval_ms, nvml,
                      rank_module=sys.argv[0] if sys.argv and sys.argv[0] else None)
    sampler.write_meta()
    sampler.start(os.getppid())
    return sampler, nvml, reason

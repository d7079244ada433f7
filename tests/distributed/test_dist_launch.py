"""The torchrun command line gpudoctor builds, the options it refuses, and how a job's end is told."""

from __future__ import annotations

import pytest

from gpudoctor.collect import distributed as d
from gpudoctor.collect.options import ProfileOptions
from gpudoctor.errors import UsageError
from gpudoctor.model import ExceptionInfo, RankEnd, RunStatus


def opts(**kw) -> ProfileOptions:
    return ProfileOptions(script="train.py", **kw)


def test_one_node_is_a_standalone_rendezvous():
    argv = d.launch_argv(opts(nproc_per_node=4), "gpudoctor.collect._child", ["-X", "utf8"])
    assert argv[1:5] == ["-X", "utf8", "-m", "torch.distributed.run"]
    assert argv[5:] == ["--nproc-per-node=4", "--standalone", "-m", "gpudoctor.collect._child"]
    assert d.torchrun_args(opts(nproc_per_node=2, master_port=29511)) == [
        "--nproc-per-node=2", "--nnodes=1", "--master-addr=127.0.0.1", "--master-port=29511"]


def test_several_nodes_use_the_c10d_rendezvous():
    args = d.torchrun_args(opts(nproc_per_node=8, nnodes="2", node_rank=1, rdzv_endpoint="node0:29400"))
    assert args == ["--nproc-per-node=8", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400",
                    "--node-rank=1"]


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(nnodes="2"), "go with --nproc-per-node"),
        (dict(nproc_per_node=2, nnodes="2"), "--rdzv-endpoint HOST:PORT"),
        (dict(nproc_per_node=2, nnodes="two"), "expected a number of nodes"),
        (dict(nproc_per_node=2, nnodes="3:1", rdzv_endpoint="h:1"), "MIN <= MAX"),
        (dict(nproc_per_node=2, nnodes="2", rdzv_endpoint="node0"), "HOST:PORT"),
        (dict(nproc_per_node=2, master_port=70000), "between 1 and 65535"),
        (dict(nproc_per_node=2, node_rank=1), "--node-rank goes with --nnodes"),
        (dict(nproc_per_node=0), "at least 1"),
    ],
)
def test_refused(kw, match):
    with pytest.raises(UsageError, match=match) as err:
        d.validate(opts(**kw))
    assert "\n" not in str(err.value)


def _end(rank, status, ended, **kw):
    return RankEnd(rank=rank, status=status, ended_ns=ended, **kw)


def test_the_first_failure_is_the_root_cause():
    ends = [
        _end(0, RunStatus.FAILED, 900, status_detail="RuntimeError: Connection closed by peer",
             exception=ExceptionInfo("RuntimeError", "Connection closed by peer [127.0.0.1]:4")),
        _end(1, RunStatus.FAILED, 500, status_detail="ValueError: bad batch at train.py:9",
             exception=ExceptionInfo("ValueError", "bad batch")),
        _end(2, RunStatus.KILLED, 950, status_detail="terminated by signal 15 (SIGTERM)", signal=15),
    ]
    out = d.job_outcome(ends, 3)
    assert out["status"] == "failed" and out["failed_rank"] == 1
    assert out["status_detail"] == (
        "rank 1 failed: ValueError: bad batch at train.py:9; then rank 0 failed too "
        "(RuntimeError: Connection closed by peer [127.0.0.1]:4); rank 2 was terminated by the launcher"
    )
    assert out["exception"]["message"] == "bad batch"


def test_all_stopped_and_silent_ranks():
    ends = [_end(r, RunStatus.STOPPED, 10, status_detail="stopped after 40 steps") for r in range(2)]
    assert d.job_outcome(ends, 2) == {"status": "stopped", "status_detail": "stopped after 40 steps (each of 2 ranks)"}
    out = d.job_outcome([_end(0, RunStatus.COMPLETED, 5), _end(1, RunStatus.RUNNING, None)], 3)
    assert out["status"] == "running" and out["failed_rank"] == 1 and "1 rank(s) of this node left no account" in out["status_detail"]


def test_collected_is_merged_across_ranks():
    states = {r: {"collected": [{"name": "cuda", "ok": False, "reason": "no GPU"},
                                {"name": "steps", "ok": True, "detail": f"{10 + r} steps"}]} for r in range(2)}
    merged = {c["name"]: c for c in d.merge_collected(states)}
    assert merged["cuda"]["reason"] == "no GPU (every one of the 2 ranks)" and not merged["cuda"]["ok"]
    assert merged["steps"]["ok"] and merged["steps"]["detail"] == "10 steps (rank 0; every one of the 2 ranks)"

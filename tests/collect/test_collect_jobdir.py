"""A torchrun job's ranks agree on one run directory (collect.jobdir): the first to come creates it and leads,
the others join it with the job's clock; the job file goes at the end; a rank alone is no job."""

from __future__ import annotations

import json

import pytest

from gpudoctor.collect import jobdir
from gpudoctor.collect.jobdir import JobDir, launched_rank
from gpudoctor.model import layout


@pytest.fixture
def rank_env(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    monkeypatch.setattr(jobdir, "_sessions", [0])


def test_the_first_rank_creates_and_leads_the_next_joins(tmp_path, rank_env):
    first = JobDir(tmp_path, "train", 111, 222)
    jobdir._sessions[0] = 0  # the other rank's first session (its own process)
    second = JobDir(tmp_path, "train", 333, 444)
    assert first.leader and not second.leader
    assert first.run_dir == second.run_dir and first.run_dir.is_dir()
    assert (second.t0_unix_ns, second.t0_mono_ns) == (111, 222)  # the job's clock, the leader's
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [first.run_dir.name]  # no second directory
    assert not list(tmp_path.glob("*.tmp"))
    third = JobDir(tmp_path, "train", 555, 666)  # this process's next session: the job's next run directory
    assert third.leader and third.run_dir != first.run_dir
    first.close()
    assert not first.path.exists() and third.path.exists()


def test_the_leader_waits_for_the_ranks_that_joined(tmp_path, rank_env):
    job = JobDir(tmp_path, "train", 1, 2)
    for rank, status in ((0, "completed"), (1, "running")):
        (job.run_dir / layout.rank_tagged(layout.CHILD_STATE, rank)).write_text(json.dumps({"status": status}))
    assert job.wait_for_ranks(timeout_s=0.2) == 2  # rank 1 never ended: given up after the timeout
    (job.run_dir / layout.rank_tagged(layout.CHILD_STATE, 1)).write_text(json.dumps({"status": "failed"}))
    assert job.wait_for_ranks(timeout_s=30) == 2


def test_a_job_file_that_names_no_directory_is_an_error(tmp_path, rank_env):
    job = JobDir(tmp_path, "train", 1, 2)
    job.path.write_text(json.dumps({"run_dir": 3}))
    jobdir._sessions[0] = 0
    with pytest.raises(OSError, match="does not name the job's run directory"):
        JobDir(tmp_path, "train", 1, 2)


def test_a_process_alone_is_no_job(monkeypatch):
    for name in ("WORLD_SIZE", "LOCAL_RANK", "RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert launched_rank() is None
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert launched_rank() is None  # no launcher's LOCAL_RANK
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert launched_rank() == (3, 2)
    monkeypatch.setenv("WORLD_SIZE", "x")
    assert launched_rank() is None

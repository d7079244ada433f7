"""``analyze --cluster ADDRESS``: the per-trace analysis on a Dask cluster gives the local report.

The test starts its own ``LocalCluster`` (two worker processes, every socket on
127.0.0.1). ``distributed`` is in the ``test`` extra, so CI runs these; a user without
it skips them (and gets a one-line error naming the extra, tested below).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from click.testing import CliRunner
from pipeline_traces import rank_folder, run_gpudoctor

from gpudoctor.cli import cli
from gpudoctor.errors import TraceFormatError, UsageError
from gpudoctor.pipeline import CLUSTER_EXTRA, analyze_paths

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def scheduler():
    # Dask's nanny writes its workers' environment (MALLOC_TRIM_THRESHOLD_, thread counts) into
    # os.environ of the process that starts them, this one: put it back for the tests after these,
    # whose training children would inherit it (GD503 reads MALLOC_* from the recorded settings)
    saved = dict(os.environ)
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                      dashboard_address="127.0.0.1:0") as cluster:
            yield cluster.scheduler_address
    finally:
        os.environ.clear()
        os.environ.update(saved)


def report(args: list[str]) -> dict:
    res = CliRunner().invoke(cli, ["analyze", "--format", "json", *args])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    data.pop("created_at")
    return data


def test_the_cluster_report_is_the_local_one(scheduler, tmp_path):
    folder = rank_folder(tmp_path / "ranks", world=4)
    local = report(["-j", "1", str(folder)])
    remote = report(["--cluster", scheduler, str(folder)])
    assert remote == local
    assert remote["rank_summary"]["straggler_rank"] == 1


def test_relative_paths_are_named_as_given(scheduler, tmp_path, monkeypatch):
    rank_folder(tmp_path / "ranks", world=3)
    monkeypatch.chdir(tmp_path)
    local = analyze_paths(["ranks"], jobs=1)
    remote = analyze_paths(["ranks"], cluster=scheduler)
    assert remote.to_dict() == local.to_dict()
    assert remote.metrics[0].path == "ranks/rank0.pt.trace.json.gz"


def test_an_unreadable_trace_gives_the_local_error(scheduler, tmp_path, monkeypatch):
    folder = rank_folder(tmp_path / "ranks", world=3)
    (folder / "rank1.pt.trace.json").write_text('{"traceEvents": [{"ph": "X", ')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TraceFormatError) as local:
        analyze_paths(["ranks"], jobs=1)
    with pytest.raises(TraceFormatError) as remote:
        analyze_paths(["ranks"], cluster=scheduler)
    assert str(remote.value) == str(local.value)


@pytest.mark.shared_traces
def test_shared_multi_rank_traces(scheduler, shared_traces, tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for rel in ("tracelens/mi300x_ddp_resnet18.json.gz", "hta/a100_rank0_of16_negative_queue.json.gz",
                "hta/a100_rank0_of2_nccl.json.gz", "hta/a100_rank3_of8_trace_diff_control.json.gz",
                "hta/v100_rank1_of2_trace_diff_test.json.gz"):
        (folder / rel.split("/")[1]).symlink_to(shared_traces / rel)
    assert report(["--cluster", scheduler, str(folder)]) == report(["-j", "1", str(folder)])
    hta = shared_traces / "hta"
    assert report(["--cluster", scheduler, str(hta)]) == report(["-j", "2", str(hta)])


def test_no_scheduler_there(tmp_path, monkeypatch):
    import socket

    import gpudoctor.pipeline as pipeline

    monkeypatch.setattr(pipeline, "CONNECT_TIMEOUT_S", 2)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = rank_folder(tmp_path / "ranks", world=2)
    with pytest.raises(UsageError, match="no Dask scheduler answered"):
        analyze_paths([folder], cluster=f"tcp://127.0.0.1:{port}")


def test_without_the_extra_the_error_names_it(tmp_path, monkeypatch):
    folder = rank_folder(tmp_path / "ranks", world=2)
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(UsageError) as err:
        analyze_paths([folder], cluster="tcp://127.0.0.1:8786")
    assert CLUSTER_EXTRA in str(err.value) and "gpudoctor[cluster]" in str(err.value)


def test_cli_error_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = rank_folder(tmp_path / "ranks", world=2)
    proc = run_gpudoctor("analyze", "--cluster", f"tcp://127.0.0.1:{port}", str(folder), timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("gpudoctor: error: --cluster")


# --------------------------------------------------------------------------- peers that are not schedulers


class _Peer:
    """A TCP server on loopback that accepts and then stays silent, or answers garbage."""

    def __init__(self, answer: bytes = b"") -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.conns: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)
            if self.answer:
                try:
                    c.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.slow  # the handshake's deadline (15 s) is what it tests
@pytest.mark.parametrize("answer", [b"", bytes(range(256)) * 64], ids=["silent", "garbage"])
def test_a_peer_that_is_not_a_scheduler_is_one_line_exit_2_in_bounded_time(tmp_path, answer):
    """A port that accepts and never answers hung analyze for 420 s and more; one that answers garbage
    gave exit 4 (MemoryError: Unable to allocate 3.07 EiB). Both: one line, exit 2, no traceback."""
    import time

    peer = _Peer(answer)
    folder = rank_folder(tmp_path / "ranks", world=2)
    try:
        t0 = time.monotonic()
        proc = run_gpudoctor("analyze", "--cluster", f"tcp://127.0.0.1:{peer.port}", str(folder), timeout=120)
        took = time.monotonic() - t0
    finally:
        peer.close()
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "did not answer as a Dask scheduler" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert took < 60  # bounded: the handshake deadline plus start-up


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:notaport", "127.0.0.1", "tcp://:8786", "tcp://h:99999"])
def test_a_malformed_address_is_refused_before_any_connection(tmp_path, address):
    import time

    folder = rank_folder(tmp_path / "ranks", world=2)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="not a Dask scheduler address"):
        analyze_paths([folder], cluster=address)
    assert time.monotonic() - t0 < 5  # no 20 s wait for a half-made client

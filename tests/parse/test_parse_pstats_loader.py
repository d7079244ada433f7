"""profile.pstats → the DataLoader fetch's share of each function (``PstatsEntry.loader_*``), along
cProfile's caller edges, from a real cProfile of code laid out as torch's fetch module is."""

from __future__ import annotations

import cProfile
import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from gpudoctor.parse.rundir import loader_times, read_pstats

FETCH_MODULE = textwrap.dedent(
    """
    import time

    def decode(n):
        return sum(i * i for i in range(n))

    def collate(items):
        time.sleep(0.02)          # storage latency, inside the loading
        return [decode(20000) for _ in items]

    def fetch(items):
        return collate(items)

    def train_step():
        decode(20000)              # called outside the loading too
        time.sleep(0.01)          # and a sleep that is not the loading's
    """
)


def _load_fetch_module(root: Path):
    path = root / "site-packages" / "torch" / "utils" / "data" / "_utils" / "fetch.py"
    path.parent.mkdir(parents=True)
    path.write_text(FETCH_MODULE)
    spec = importlib.util.spec_from_file_location("fake_torch_fetch", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pstats")
    mod = _load_fetch_module(root)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        mod.fetch([1, 2])
        mod.train_step()
    prof.disable()
    d = root / "run"
    d.mkdir()
    prof.dump_stats(str(d / "profile.pstats"))
    (d / "manifest.json").write_text(json.dumps({}))
    return d


def _by_name(entries, name):
    return [e for e in entries if e.function == name]


def test_time_inside_the_fetch_is_shared_out_along_caller_edges(run_dir: Path) -> None:
    entries = read_pstats(run_dir, [])
    (fetch,) = _by_name(entries, "fetch")
    assert fetch.loader_cumtime_s == pytest.approx(fetch.cumtime_s, rel=1e-3)
    (sleep,) = _by_name(entries, "<built-in method time.sleep>")
    # three 20 ms sleeps inside the fetch, three 10 ms outside: only the first count as the loading's
    assert sleep.tottime_s >= 0.09
    assert 0.55 < sleep.loader_tottime_s / sleep.tottime_s < 0.8  # 2/3, whatever the sleeps overshoot
    # decode() runs 6 times inside the fetch and 3 times outside: about 2/3 of its time is the loading's
    (decode,) = _by_name(entries, "decode")
    assert 0.4 * decode.cumtime_s < decode.loader_cumtime_s < 0.9 * decode.cumtime_s
    assert decode.loader_tottime_s <= decode.tottime_s
    (step,) = _by_name(entries, "train_step")
    assert step.loader_cumtime_s == 0.0 and step.loader_tottime_s == 0.0


def test_no_fetch_in_the_process_leaves_no_loader_times(tmp_path: Path) -> None:
    prof = cProfile.Profile()
    prof.enable()
    sum(i for i in range(1000))
    prof.disable()
    prof.create_stats()
    assert loader_times(prof.stats) == {}  # type: ignore[attr-defined]
    # and the parse still keeps the top functions by cumulative time
    d = tmp_path / "run"
    d.mkdir()
    prof.dump_stats(str(d / "profile.pstats"))
    entries = read_pstats(d, [])
    assert entries and all(e.loader_cumtime_s == 0.0 for e in entries)


def test_cycles_end(tmp_path: Path) -> None:
    # a hand-made statistics dictionary with a cycle under the fetch: the propagation stops
    fetch = ("/x/torch/utils/data/_utils/fetch.py", 1, "fetch")
    a, b = ("/u.py", 1, "a"), ("/u.py", 2, "b")
    stats = {
        fetch: (1, 1, 0.0, 1.0, {}),
        a: (2, 2, 0.2, 1.0, {fetch: (1, 1, 0.1, 1.0), b: (1, 1, 0.1, 0.5)}),
        b: (1, 1, 0.5, 0.8, {a: (1, 1, 0.5, 0.8)}),
    }
    out = loader_times(stats)
    assert set(out) == {fetch, a, b}
    assert all(tt <= stats[k][2] + 1e-9 and ct <= stats[k][3] + 1e-9 for k, (tt, ct) in out.items())



def test_the_machines_memory_is_read_from_the_samples_meta(tmp_path: Path) -> None:
    from gpudoctor.parse.rundir import read_samples

    (tmp_path / "samples.jsonl").write_text(
        json.dumps({"kind": "meta", "interval_ms": 200.0, "system_cpu_count": 2, "system_memory_bytes": 8 * 2**30})
        + "\n"
    )
    samples = read_samples(tmp_path, [])
    assert samples is not None and samples.system_memory_bytes == 8 * 2**30 and samples.system_cpu_count == 2
    (tmp_path / "samples.jsonl").write_text(json.dumps({"kind": "meta", "interval_ms": 200.0}) + "\n")
    assert read_samples(tmp_path, []).system_memory_bytes is None  # a run recorded before the field

"""profile.pstats and loader.pstats → the DataLoader fetch's share of each function (``PstatsEntry.loader_*``),
from real cProfiles of code laid out as torch's fetch module is."""

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
    """As ``gpudoctor profile`` writes it: the training loop's profile, and the DataLoader's calls apart
    (``collect.loaderprof`` swaps the two profilers around each batch asked for)."""
    root = tmp_path_factory.mktemp("pstats")
    mod = _load_fetch_module(root)
    main, loader = cProfile.Profile(), cProfile.Profile()
    for _ in range(3):
        loader.enable()
        mod.fetch([1, 2])
        loader.disable()
        main.enable()
        mod.train_step()
        main.disable()
    d = root / "run"
    d.mkdir()
    main.dump_stats(str(d / "profile.pstats"))
    loader.dump_stats(str(d / "loader.pstats"))
    (d / "manifest.json").write_text(json.dumps({}))
    return d


def _by_name(entries, name):
    return [e for e in entries if e.function == name]


def test_the_fetch_comes_from_the_loaders_own_profile(run_dir: Path) -> None:
    import marshal

    loader = marshal.loads((run_dir / "loader.pstats").read_bytes())
    main = marshal.loads((run_dir / "profile.pstats").read_bytes())
    entries = read_pstats(run_dir, [])
    (fetch,) = _by_name(entries, "fetch")
    assert fetch.loader_cumtime_s == pytest.approx(fetch.cumtime_s, rel=1e-3)
    # the two files add up: three 20 ms sleeps inside the fetch, three 10 ms outside, and only the first
    # are the loading's, exactly as the loader's own profile timed them
    (sleep,) = _by_name(entries, "<built-in method time.sleep>")
    [lk] = [k for k in loader if k[2] == "<built-in method time.sleep>"]
    [mk] = [k for k in main if k[2] == "<built-in method time.sleep>"]
    assert sleep.tottime_s == pytest.approx(loader[lk][2] + main[mk][2], abs=2e-6) and sleep.tottime_s >= 0.09
    assert sleep.loader_tottime_s == pytest.approx(loader[lk][2], abs=2e-6)
    assert sleep.calls == 6
    # decode() runs 6 times inside the fetch and 3 times outside: its time inside is the loader's profile's
    (decode,) = _by_name(entries, "decode")
    [dk] = [k for k in loader if k[2] == "decode"]
    assert decode.loader_cumtime_s == pytest.approx(loader[dk][3], abs=2e-6)
    assert decode.loader_cumtime_s < decode.cumtime_s
    (step,) = _by_name(entries, "train_step")
    assert step.loader_cumtime_s == 0.0 and step.loader_tottime_s == 0.0


def test_without_the_loaders_profile_only_code_wholly_inside_the_fetch_counts(tmp_path: Path) -> None:
    """A run recorded before loader.pstats existed: one profile of everything. A function called from
    inside the fetch and from outside it (decode, time.sleep here; nn.Module.__call__ in a real script,
    which runs a transform and the model alike) gets no share: the shares spread along its caller edges
    reached the model's forward (GD201 named torch.conv2d as the loading's hot function on mnist)."""
    mod = _load_fetch_module(tmp_path)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3):
        mod.fetch([1, 2])
        mod.train_step()
    prof.disable()
    d = tmp_path / "run"
    d.mkdir()
    prof.dump_stats(str(d / "profile.pstats"))
    entries = read_pstats(d, [])
    (fetch,) = _by_name(entries, "fetch")
    (collate,) = _by_name(entries, "collate")
    assert fetch.loader_cumtime_s == pytest.approx(fetch.cumtime_s, rel=1e-3)
    assert collate.loader_cumtime_s == pytest.approx(collate.cumtime_s, rel=1e-3)  # called from the fetch alone
    for name in ("decode", "<built-in method time.sleep>", "train_step"):
        (e,) = _by_name(entries, name)
        assert e.loader_cumtime_s == 0.0 and e.loader_tottime_s == 0.0, name


def test_a_shared_module_call_never_leads_into_the_model() -> None:
    """mnist's shape, by hand: the fetch runs a transform through nn.Module's _call_impl, and so does the
    training loop with the model, whose forward calls _call_impl again (a cycle of caller edges)."""
    fetch = ("/x/torch/utils/data/_utils/fetch.py", 1, "fetch")
    getitem, loop = ("/u/main.py", 40, "__getitem__"), ("/u/main.py", 90, "train")
    call = ("/x/torch/nn/modules/module.py", 1782, "_call_impl")
    normalize, model = ("/u/main.py", 16, "forward"), ("/u/main.py", 58, "forward")
    conv = ("~", 0, "<built-in method torch.conv2d>")
    stats = {
        fetch: (10, 10, 0.01, 0.11, {}),
        getitem: (640, 640, 0.04, 0.10, {fetch: (640, 640, 0.04, 0.10)}),
        loop: (1, 1, 0.05, 1.0, {}),
        call: (3000, 3000, 0.05, 1.4, {getitem: (640, 640, 0.01, 0.03), loop: (10, 10, 0.01, 0.9),
                                       model: (2000, 2000, 0.03, 0.5)}),
        normalize: (640, 640, 0.02, 0.02, {call: (640, 640, 0.02, 0.02)}),
        model: (10, 10, 0.1, 0.85, {call: (10, 10, 0.1, 0.85)}),
        conv: (20, 20, 0.32, 0.32, {model: (20, 20, 0.32, 0.32)}),
    }
    assert set(loader_times(stats, strict=True)) == {fetch, getitem}
    guessed = loader_times(stats)  # the caller edges' shares: the model's code gets a part of the fetch
    assert guessed.get(conv, (0.0, 0.0))[0] > 0.0


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

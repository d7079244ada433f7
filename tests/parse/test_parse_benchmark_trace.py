"""The benchmark's generated trace (benchmarks/analyze.py) is a valid Kineto trace both
parsers read alike, with what the benchmark claims is in it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gpudoctor.analysis import analyze_trace
from gpudoctor.model.metrics import GapCause
from gpudoctor.parse.kineto import read_trace_chunked
from gpudoctor.parse.stream import read_trace_streaming


def _bench(root: Path):
    spec = importlib.util.spec_from_file_location("gpudoctor_bench_analyze", root / "benchmarks" / "analyze.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_trace_parses_and_has_what_it_says(tmp_path, root):
    p = tmp_path / "bench.pt.trace.json"
    n = _bench(root).generate_trace(p, 1_500_000)
    fast = read_trace_chunked(p, chunk_bytes=64 << 10)
    slow = read_trace_streaming(p)
    assert fast.info.event_count == slow.info.event_count == n
    assert list(fast.device.ts_ns) == list(slow.device.ts_ns) and len(fast.host) == len(slow.host)
    m = analyze_trace(fast)
    assert len(m.steps) >= 3 and m.has_stacks and m.has_shapes
    assert m.syncs.count >= len(m.steps) and m.optimizer_steps == len(m.steps)
    assert {t.direction for t in m.transfers} == {"HtoD", "DtoH"}
    assert m.kernels.fp32_eligible_op_count > 0 and m.backward_ops > 0
    causes = {c.cause for c in m.utilization[0].gap_causes}
    assert GapCause.DATALOADER in causes


def test_benchmark_smoke_run_prints_its_figures(tmp_path, root, capsys):
    """The benchmark end to end on tiny traces (the real run takes minutes): it writes the
    layouts and the rank folder, runs every contender and prints the ratios."""
    bench = _bench(root)
    rc = bench.main(["--size-mb", "2", "--rank-mb", "0.5", "--ranks", "2", "--repeat", "1",
                     "--layouts", "minified,gzip", "--keep", str(tmp_path), "--no-targets"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "[minified]" in out and "[gzip]" in out and "[ranks]" in out
    assert "json.load / gpudoctor: x" in out and "--jobs" in out
    assert "torch imported by gpudoctor analyze: False" in out
    assert sorted(p.name for p in (tmp_path / "ranks").iterdir()) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]

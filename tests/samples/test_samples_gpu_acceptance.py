"""benchmarks/gpu_acceptance.py on a machine without CUDA: its plan, its clean skip, and its checks
on made-up run records (the GPU part itself runs only where a GPU is lent, docs/gpu-acceptance.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from gpudoctor.model import GpuSample, Manifest, RunData, Samples, StepRecord
from gpudoctor.model.run import Collected, RunStatus

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpudoctor_bench_gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


ga = _load()


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


def _cuda_here() -> bool:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                         capture_output=True, text=True, timeout=300)
    return out.stdout.strip().endswith("True")


# --------------------------------------------------------------------------- the plan and the skip


def test_dry_run_lists_every_sample_script_the_probes_and_what_is_checked():
    res = _cli("--dry-run")
    assert res.returncode == 0, res.stderr
    names = [s.name for s in ga.discover()]
    planned, _, later = res.stdout.partition("left for another call")
    for name in (*names, *ga.PROBES, ga.OVERHEAD):
        assert f"    {name} " in planned or name in later.split("\n", 1)[0], name
    for check in ("expected", "nvml", "cuda events", "trace", "roofline", "gpudoctor verify"):
        assert check in res.stdout
    assert "pageable_copies" in res.stdout.split("gpudoctor verify", 1)[1]
    # what only a GPU shows first: the overhead case, the probes, the verified scenarios, the negative
    # control, then the other scenarios that need a GPU
    tasks = ga.plan(ga.discover(), None)
    assert tasks[0].overhead and [t.name for t in tasks[1:3]] == list(ga.PROBES)
    assert {t.name for t in tasks[3:5]} == set(ga.VERIFY) and tasks[5].name == "tuned_baseline"
    gpu = [t.name for t in tasks[6:] if next(s for s in ga.discover() if s.name == t.name).needs_gpu]
    assert [t.name for t in tasks[6:6 + len(gpu)]] == gpu


def test_the_default_plan_fits_one_call_of_nine_minutes():
    """Issue 37: the device tool gives one call of at most 10 minutes; the plan's estimate fits 9, with the
    overhead case and the negative control in its first half, and says what it leaves for another call."""
    res = _cli("--dry-run")
    kept, left = ga.fit(ga.plan(ga.discover(), None), 480.0)
    total = sum(t.est_s for t in kept)
    assert total <= 9 * 60 and f"estimated {total:.0f} s" in res.stdout
    half = [t.name for t in kept[: (len(kept) + 1) // 2]]
    assert ga.OVERHEAD in half and "tuned_baseline" in half
    assert {"probe_fp32_matmul", "probe_bf16_matmul", *ga.VERIFY} <= {t.name for t in kept}
    if left:
        assert "left for another call" in res.stdout and left[0].name in res.stdout


def test_the_packages_it_checks_are_pyprojects_dependencies():
    """Every package gpudoctor imports on a report with findings is checked before the run starts (the first
    H200 run lost every report to a missing libcst): the list is pyproject.toml's, and the dry run names it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    dists = {d.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip().lower() for d in deps}
    assert dists == {d for d, _m in ga.REQUIRED} | {d for d, _m in ga.OPTIONAL}
    assert ga.missing_packages() == []  # all installed here
    res = _cli("--dry-run")
    assert "libcst (libcst)" in res.stdout and "msgspec (msgspec)" in res.stdout


def test_an_unknown_name_is_a_usage_error():
    res = _cli("--dry-run", "--only", "no_such_script")
    assert res.returncode == 2 and "no_such_script" in res.stderr


def test_without_cuda_it_skips_cleanly_and_says_what_it_would_check(tmp_path):
    if _cuda_here():
        pytest.skip("CUDA is available here: the acceptance run would run, not skip")
    res = _cli("--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "skipped: no CUDA device here" in res.stdout and "each run is checked for" in res.stdout
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


# --------------------------------------------------------------------------- the checks


def _task(expected=("GD301",), absent=(), probe=False, name="pageable_copies"):
    return ga.Task(name, SCRIPT, tuple(expected), probe=probe, absent=tuple(absent))


def _report(findings=(), rows=(), peak=True, gpu=True):
    roofline = {
        "device_name": "NVIDIA H100 80GB HBM3",
        "peak": {"name": "H100 SXM"} if peak else None,
        "achieved_tflops": 500.0, "peak_pct": 50.0, "mfu_pct": 30.0,
        "rows": [dict(op_class=c, dtype=d, peak_pct=p, achieved_tflops=1.0, peak_tflops=989.4, kernel_ns=1)
                 for c, d, p in rows],
    }
    metrics = [{"has_gpu_activity": gpu, "devices": [{"name": "NVIDIA H100 80GB HBM3"}], "roofline": roofline}]
    return {"findings": [{"code": c, "severity": s} for c, s in findings], "run": {"metrics": metrics}}


def test_expected_every_planted_code_and_none_of_the_unwanted():
    assert ga.check_expected(_task(("GD301", "GD302")), _report([("GD302", "info"), ("GD301", "error")])).ok
    miss = ga.check_expected(_task(("GD301", "GD302")), _report([("GD301", "error")]))
    assert not miss.ok and "missing GD302" in miss.detail
    bad = ga.check_expected(_task((), ("GD405",)), _report([("GD405", "info")]))
    assert not bad.ok and "unwanted GD405" in bad.detail
    baseline = ga.Task("tuned_baseline", SCRIPT, ())
    assert ga.check_expected(baseline, _report([("GD104", "info")])).ok
    assert not ga.check_expected(baseline, _report([("GD201", "warning")])).ok


def _run(samples=(), steps=(), nvml_ok=True):
    mf = Manifest(schema_version=1, gpudoctor_version="0.1.0", run_id="r", command=("train.py",), script="train.py",
                  module=None, argv=("train.py",), cwd="/work", started_at="2026-01-01T00:00:00+00:00",
                  started_at_unix_ns=0, status=RunStatus.STOPPED,
                  collected=(Collected("nvml", nvml_ok, "" if nvml_ok else "NVML: permission denied"),))
    return RunData(source="r", manifest=mf, steps=tuple(steps), samples=Samples(gpu=tuple(samples)))


def test_nvml_needs_real_readings():
    real = [GpuSample(i, 0, util_pct=90.0, mem_total_bytes=80 << 30) for i in range(3)]
    assert ga.check_nvml(_run(real)).ok
    assert not ga.check_nvml(_run([GpuSample(i, 0) for i in range(3)])).ok  # sampled, nothing read
    refused = ga.check_nvml(_run(real, nvml_ok=False))
    assert not refused.ok and "permission denied" in refused.detail


def test_cuda_events_in_most_steps():
    timed = [StepRecord(i, i * 10, 10, gpu_ns=9) for i in range(6)]
    untimed = [StepRecord(i, i * 10, 10) for i in range(6, 20)]
    assert ga.check_cuda_events(_run(steps=timed)).ok
    assert not ga.check_cuda_events(_run(steps=timed + untimed)).ok
    assert not ga.check_cuda_events(_run()).ok
    assert ga.check_status(_run()).ok


def test_trace_and_roofline_plausibility():
    assert ga.check_trace(_report()).ok and not ga.check_trace(_report(gpu=False)).ok
    assert ga.check_roofline(_task(), _report(rows=[("matmul", "bf16", 60.0)])).ok
    over = ga.check_roofline(_task(), _report(rows=[("matmul", "bf16", 130.0)]))
    assert not over.ok and "beyond the peak" in over.detail
    unknown = ga.check_roofline(_task(), _report(peak=False))
    assert not unknown.ok and "analysis/peaks.py" in unknown.detail
    probe = _task((), ("GD405",), probe=True, name="probe_bf16_matmul")
    assert ga.check_roofline(probe, _report(rows=[("matmul", "bf16", 70.0)])).ok
    assert not ga.check_roofline(probe, _report(rows=[("matmul", "bf16", 5.0)])).ok  # FLOPs lost somewhere
    assert not ga.check_roofline(probe, _report(rows=[("matmul", "fp32", 70.0)])).ok  # the wrong precision


def test_verification_confirmed_or_inconclusive_passes():
    def rep(status):
        return {"findings": [{"code": "GD301", "severity": "error",
                              "verification": {"status": status, "speedup": 1.3, "ci": [1.1, 1.5], "reason": "r"}}]}

    assert ga.verification_check(_task(), rep("confirmed")).ok
    assert ga.verification_check(_task(), rep("inconclusive")).ok
    refuted = ga.verification_check(_task(), rep("refuted"))
    assert not refuted.ok and "1.30x [1.10-1.50]" in refuted.detail
    assert not ga.verification_check(_task(), {"findings": []}).ok


def test_the_bundle_fits_the_device_tools_file_limit(tmp_path):
    fixtures = tmp_path / "gpu"
    for i, size in enumerate((40_000, 90_000, 10_000)):
        d = fixtures / f"run{i}"
        d.mkdir(parents=True)
        (d / f"t{i}.pt.trace.json.gz").write_bytes(os.urandom(size))  # incompressible
        (d / "manifest.json").write_text("{}")
    (fixtures / "index.json").write_text("{}")
    left = ga.bundle(fixtures, tmp_path / "b.tar.gz", max_bytes=70_000)
    assert left == ["run1/t1.pt.trace.json.gz"]
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        names = set(tar.getnames())
    assert "index.json" in names and "run0/t0.pt.trace.json.gz" in names and "run1/manifest.json" in names
    assert (tmp_path / "b.tar.gz").stat().st_size <= 70_000


# --------------------------------------------------------------------------- the GPU overhead case's tools


@pytest.mark.slow
def test_the_gpu_loop_switches_gpudoctors_hooks_in_one_process(tmp_path):
    """overhead.py --gpu tells where a GPU loop's cost comes from by switching gpudoctor's hooks off and on
    in one profiled process (gpu_train_loop.py --ab-hooks). Its code runs on the CPU too (--device cpu): a
    device session must not be the first to run it."""
    times = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "profile", "--no-report", "--out", str(tmp_path / "runs"),
         "--skip-first", "1000000000", "--no-cprofile", str(ROOT / "benchmarks" / "gpu_train_loop.py"), "--",
         "--model", "mlp", "--device", "cpu", "--steps", "130", "--ab-hooks", "--step-times", str(times)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(times.read_text())
    assert len(got["gpu"]) == len(got["wall"]) == len(got["on"]) == 130
    assert got["on"].count(1) >= 25 and got["on"].count(0) >= 25  # blocks of 25 after 50 warm-up steps
    assert any("Adam.step" in s for s in got["switched"]) and any("backward" in s for s in got["switched"])


@pytest.mark.slow
def test_the_cupti_probe_runs_its_three_bare_loops(tmp_path):
    """benchmarks/cupti_weight.py (issue 44): a bare loop with one torch.profiler window of its own, with
    TEARDOWN_CUPTI=0 and =1, against the loop alone. On the CPU there is no CUPTI: the figures mean nothing
    here; what is checked is that the one device call cannot be the first to run this code."""
    out = tmp_path / "cupti.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cupti_weight.py"), "--device", "cpu",
                           "--loops", "mlp", "--steps", "90", "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())["mlp"]
    assert got["window"] == [30, 35] and got["steps"] == 90
    assert set(got["runs"]) == {"no window", "window, TEARDOWN_CUPTI=0", "window, TEARDOWN_CUPTI=1"}
    assert got["runs"]["no window"]["residue"] == 1.0
    assert all(r["before_ms"] > 0 and r["after_ms"] > 0 for r in got["runs"].values())
    times = json.loads(next(Path(proc.stdout.split("runs kept in ")[1].strip()).glob("cupti-mlp-1.json")).read_text())
    assert times["window"] == [30, 35] and len(times["gpu"]) == 90

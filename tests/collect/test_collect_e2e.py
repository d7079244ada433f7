"""`gpudoctor profile` end to end on the CPU: the script runs as under python, the run directory is complete."""

from __future__ import annotations

import gzip
import json
import pstats
import re
from pathlib import Path

import pytest
from collect_testlib import (
    FAST_SCHEDULE,
    collected,
    copy_script,
    manifest,
    only_run_dir,
    profiler_steps,
    run_profile,
    samples,
    settings,
    site_lines,
    steps,
)

from gpudoctor.model import Manifest, Samples, Settings, StepRecord

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """train_small.py with one fork worker, 2 epochs of 8 steps, ending with sys.exit(3)."""
    work = tmp_path_factory.mktemp("basic")
    script = copy_script("train_small.py", work)
    proc = run_profile(
        "--no-report", "--out", "runs", *FAST_SCHEDULE, "train_small.py", "--",
        "--workers", "1", "--context", "fork", "--probe", "probe.json", "--exit", "3",
        cwd=work,
    )
    run_dir = only_run_dir(work / "runs")
    return work, script, proc, run_dir


def test_exit_code_and_output_are_the_scripts(basic):
    work, script, proc, run_dir = basic
    assert proc.returncode == 3, proc.stderr
    assert "train_small: 16 iterations" in proc.stdout
    m = manifest(run_dir)
    assert m["status"] == "completed" and m["exit_code"] == 3
    assert "sys.exit(3)" in m["status_detail"]


def test_the_script_sees_what_python_gives_it(basic):
    work, script, proc, run_dir = basic
    probe = json.loads((work / "probe.json").read_text())
    assert probe["name"] == "__main__"
    assert probe["argv"] == ["train_small.py", "--workers", "1", "--context", "fork", "--probe", "probe.json", "--exit", "3"]
    assert Path(probe["path0"]) == work
    assert Path(probe["file"]) == script
    assert Path(probe["cwd"]) == work


def test_manifest_says_what_was_run_and_collected(basic):
    work, script, proc, run_dir = basic
    m = manifest(run_dir)
    man = Manifest.from_dict(m)
    assert man.to_dict() == m
    assert m["schema_version"] == 1 and m["run_id"] == run_dir.name
    assert re.fullmatch(r"train_small-\d{8}-\d{6}", run_dir.name)
    assert m["script"] == str(script) and m["module"] is None and m["cwd"] == str(work)
    assert m["argv"][0] == "train_small.py"
    assert m["command"][-2:] == ["--exit", "3"] and "train_small.py" in m["command"]
    assert m["versions"]["python"] and m["versions"]["torch"].startswith("2.")
    assert m["duration_s"] > 0 and m["ended_at"] and m["started_at_unix_ns"] > 0
    assert m["schedule"]["skip_first"] == 2 and m["schedule"]["active"] == 3
    assert m["step_source"] == "optimizer" and m["steps_seen"] == 16
    assert m["profiler_owner"] == "gpudoctor"
    assert collected(m, "steps")["ok"] and collected(m, "torch.profiler")["ok"]
    assert collected(m, "psutil")["ok"] and collected(m, "settings")["ok"]
    cp = collected(m, "cprofile")
    assert cp["ok"] and cp["detail"].startswith("steps 6..7")
    # on this CPU machine: no CUDA in torch, no NVML, each with the reason why
    cuda, nvml = collected(m, "cuda"), collected(m, "nvml")
    assert cuda["ok"] or cuda["reason"]
    assert nvml["ok"] or nvml["reason"]
    leftovers = [p.name for p in run_dir.iterdir() if p.name.startswith(".") or p.name.endswith(".tmp")]
    assert leftovers == []


def test_every_step_is_recorded(basic):
    work, script, proc, run_dir = basic
    rows = steps(run_dir)
    assert [r["index"] for r in rows] == list(range(16))
    recs = [StepRecord.from_dict(r) for r in rows]
    assert all(r.wall_ns > 0 for r in recs)
    # CPU figures: each reading covers its step and the short ones right before it that carry none
    covered = 0
    for r in recs:
        if r.user_cpu_ns is None:
            assert r.sys_cpu_ns is None and r.minor_faults is None and not r.cpu_steps
        else:
            assert r.minor_faults is not None and r.cpu_steps is not None and 1 <= r.cpu_steps <= r.index + 1 - covered
            covered = r.index + 1
    assert all(0 <= r.data_wait_ns <= r.wall_ns for r in recs)
    assert sum(r.data_wait_ns for r in recs) > 0  # a worker feeds the batches
    assert [r.epoch for r in recs] == [0] * 8 + [1] * 8
    windows = {r.index: r.window for r in recs if r.window}
    assert windows == {2: "warmup", 3: "active", 4: "active", 5: "active", 6: "cprofile", 7: "cprofile",
                       8: "warmup", 9: "active", 10: "active", 11: "active"}
    assert [r.index for r in recs if r.profiled] == [3, 4, 5, 9, 10, 11]
    for a, b in zip(recs, recs[1:], strict=False):
        assert b.start_ns >= a.start_ns + a.wall_ns


def test_traces_hold_the_active_steps_by_their_run_index(basic):
    work, script, proc, run_dir = basic
    m = manifest(run_dir)
    assert len(m["traces"]) == 2
    by_name = sorted(m["traces"])
    assert [t.split(".")[-5] for t in by_name] == ["00000003", "00000009"]
    assert profiler_steps(run_dir / by_name[0]) == [3, 4, 5]
    assert profiler_steps(run_dir / by_name[1]) == [9, 10, 11]
    with gzip.open(run_dir / by_name[0], "rt") as f:
        trace = json.load(f)
    assert trace["record_shapes"] == 1 and trace["with_stack"] == 1
    with gzip.open(run_dir / by_name[1], "rt") as f:
        later = json.load(f)
    assert "with_stack" not in later and "record_shapes" not in later  # later windows: timings only
    assert "shapes, stacks in the first 1 window(s)" in collected(m, "torch.profiler")["detail"]
    names = {e.get("name") for e in trace["traceEvents"]}
    assert any(str(n).startswith("Optimizer.step#SGD") for n in names)
    # the trace's clock and the run's: ProfilerStep#3 starts where step 3 starts
    step3 = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#3")
    trace_ns = trace["baseTimeNanoseconds"] + step3["ts"] * 1000
    rec3 = steps(run_dir)[3]
    assert abs(trace_ns - (m["started_at_unix_ns"] + rec3["start_ns"])) < 200_000_000  # a preemption between stamps


def test_samples_cover_the_process_and_its_worker(basic):
    work, script, proc, run_dir = basic
    rows = samples(run_dir)
    assert rows[0] == {"kind": "meta", "interval_ms": 200.0, "system_cpu_count": rows[0]["system_cpu_count"],
                       "system_memory_bytes": rows[0]["system_memory_bytes"]}
    assert rows[0]["system_memory_bytes"] > 0
    procs = [r for r in rows if r["kind"] == "process"]
    assert procs and {r["role"] for r in procs} >= {"main"}
    main = [r for r in procs if r["role"] == "main"]
    assert all(r["rss_bytes"] > 0 and r["threads"] >= 1 for r in main)
    # The first sample may catch the child right after exec, before torch is loaded;
    # the training process itself holds torch (well over 10 MB).
    assert max(r["rss_bytes"] for r in main) > 10_000_000
    parsed = Samples(process=tuple(Samples.from_dict({"process": [r]}).process[0] for r in procs))
    assert len(parsed.process) == len(procs)


def test_settings_and_pstats_are_written(basic):
    work, script, proc, run_dir = basic
    s = Settings.from_dict(settings(run_dir))
    (dl,) = s.dataloaders
    assert dl.num_workers == 1 and dl.batch_size == 8 and dl.multiprocessing_context == "fork"
    assert dl.call_site is not None and dl.call_site.file == "train_small.py"
    assert script.read_text().splitlines()[dl.call_site.line - 1].strip().startswith("loader = DataLoader(")
    assert dl.iterations_started == 2 and dl.dataset == "Squares" and dl.dataset_len == 64
    (opt,) = s.optimizers
    assert opt.cls == "torch.optim.SGD" and opt.foreach is False and opt.num_param_tensors == 4
    assert s.device_type == "cpu" and s.num_threads == 1 and s.env.get("OMP_NUM_THREADS") == "1"
    st = pstats.Stats(str(run_dir / "profile.pstats"))
    assert any(fn[2] == "check_batch" for fn in st.stats)


def test_summary_on_stderr(basic):
    work, script, proc, run_dir = basic
    err = proc.stderr
    assert re.search(r"gpudoctor: 16 steps \(optimizer steps\); step time [\d.]+ (ms|µs) \(mean\), median [\d.]+ (ms|µs), "
                     r"p90 [\d.]+ (ms|µs); waiting for data [\d.]+% of step time", err)
    assert f"gpudoctor: run directory runs/{run_dir.name}" in err
    assert "USDT" not in err and "Traceback" not in err
    # one value per quantity: the stderr line prints the report's own figures
    from gpudoctor.cli import load_and_analyze
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose
    from gpudoctor.report import _fmt

    summary = {x.key: x for x in diagnose(load_and_analyze([str(run_dir)]), Config(), kind="profile").summary}
    step, med, p90 = (_fmt.duration(summary[k].value * 1e6) for k in ("step_time", "step_time_median", "step_time_p90"))
    wait = _fmt.pct(summary["data_wait_share"].value)
    assert f"step time {step} (mean), median {med}, p90 {p90}; waiting for data {wait} of step time" in err


def test_spawn_workers_do_not_rerun_the_instruments(tmp_path):
    copy_script("train_small.py", tmp_path)
    proc = run_profile(
        "--no-report", "--out", "runs", *FAST_SCHEDULE, "train_small.py", "--",
        "--workers", "1", "--context", "spawn", "--epochs", "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "completed" and m["steps_seen"] == 8
    assert [r["index"] for r in steps(run_dir)] == list(range(8))
    assert settings(run_dir)["dataloaders"][0]["multiprocessing_context"] == "spawn"
    # one training process reported; a re-run in the worker would have written a second set
    assert sorted(p.name for p in run_dir.iterdir() if p.suffix in (".jsonl", ".json")) == [
        "manifest.json", "samples.jsonl", "settings.json", "steps.jsonl"]
    assert "train_small: 8 iterations" in proc.stdout


def test_steps_limit_stops_cleanly(tmp_path):
    copy_script("train_small.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "--steps", "7", *FAST_SCHEDULE, "train_small.py", "--", "--epochs", "50", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "iterations" not in proc.stdout  # the script did not get to its end
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "stopped" and m["status_detail"] == "stopped after 7 steps"
    assert m["exit_code"] == 0 and m["max_steps"] == 7
    assert len(steps(run_dir)) == 7
    assert profiler_steps(run_dir / m["traces"][0]) == [3, 4, 5]


def test_module_run_like_python_dash_m(tmp_path):
    copy_script("modpkg", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "-m", "modpkg.train_mod", "--", "probe.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    probe = json.loads((tmp_path / "probe.json").read_text())
    origin = str(tmp_path / "modpkg" / "train_mod.py")
    assert probe == {"name": "__main__", "argv": [origin, "probe.json"], "path0": str(tmp_path), "spec": "modpkg.train_mod"}
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["module"] == "modpkg.train_mod" and m["script"] is None and m["steps_seen"] == 4
    assert run_dir.name.startswith("modpkg.train_mod-")


def test_without_an_optimizer_calls_of_the_model_are_steps(tmp_path):
    """An evaluation loop over a DataLoader: the root module's calls mark the steps (one per batch)."""
    copy_script("train_small.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", *FAST_SCHEDULE, "train_small.py", "--", "--no-optimizer", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["step_source"] == "module" and m["steps_seen"] == 16
    root = m["root_module"]  # under torch.no_grad(), in train mode (the script never calls model.eval())
    assert (root["name"], root["calls"], root["calls_with_grad"], root["eval_calls"]) == ("Sequential", 16, 0, 0)
    assert root["first_grad_call_site"] is None and root["eval_grad_call_site"] is None
    rows = steps(run_dir)
    assert [r["epoch"] for r in rows] == [0] * 8 + [1] * 8
    assert all(r["batches"] == 1 and r["forward_ns"] > 0 and r["marker"] == "module" for r in rows)
    assert profiler_steps(run_dir / sorted(m["traces"])[0]) == [3, 4, 5]


def test_a_script_running_torch_profiler_itself_completes(tmp_path):
    copy_script("own_profiler.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "--skip-first", "1", "own_profiler.py", "--", str(tmp_path / "mine"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "own_profiler: done" in proc.stdout
    (own,) = (tmp_path / "mine").iterdir()
    assert own.name.startswith("mine.") and own.name.endswith(".pt.trace.json")
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["profiler_owner"] == "user" and m["status"] == "completed"
    (copy,) = m["traces"]
    assert copy.endswith(".pt.trace.json.gz")
    assert profiler_steps(run_dir / copy) == [2, 3]  # the script's own ProfilerStep numbers
    tp = collected(m, "torch.profiler")
    assert tp["ok"] and "the script ran torch.profiler itself" in tp["detail"]


def test_settings_carry_the_line_that_set_them(tmp_path):
    script = copy_script("settings_zoo.py", tmp_path)
    (tmp_path / "store").mkdir()
    proc = run_profile("--no-report", "--out", "runs", "settings_zoo.py", "--", str(tmp_path / "store"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = site_lines(script)
    s = Settings.from_dict(settings(only_run_dir(tmp_path / "runs")))

    def at(site, tag):  # noqa: ANN001, ANN202
        assert site is not None, tag
        assert (site.file, site.line) == ("settings_zoo.py", lines[tag]), (site, tag)

    for flag, tag, value in (
        ("torch.backends.cudnn.benchmark", "cudnn_benchmark", True),
        ("torch.backends.cudnn.deterministic", "cudnn_deterministic", False),
        ("torch.backends.cuda.matmul.allow_tf32", "matmul_tf32", True),
        ("torch.backends.cudnn.allow_tf32", "cudnn_tf32", True),
        ("torch.float32_matmul_precision", "matmul_precision", "high"),
        ("torch.set_num_threads", "num_threads", 1),
    ):
        f = s.flag(flag)
        assert f is not None and f.value == value, (flag, f)
        at(f.call_site, tag)
    assert s.flag("torch.use_deterministic_algorithms").call_site is None  # left at its default
    (dl,) = s.dataloaders
    at(dl.call_site, "dataloader")
    assert (dl.batch_size, dl.num_workers, dl.pin_memory, dl.drop_last, dl.prefetch_factor) == (4, 0, False, True, None)
    adam, sgd = s.optimizers
    at(adam.call_site, "adam")
    at(sgd.call_site, "sgd")
    assert (adam.cls, adam.foreach, adam.fused) == ("torch.optim.Adam", False, None)
    assert (sgd.cls, sgd.fused, sgd.supports_fused) == ("torch.optim.SGD", True, True)
    ac = {(a.device_type, a.deprecated_api): a for a in s.autocast}
    at(ac["cpu", False].call_site, "autocast")
    at(ac["cpu", True].call_site, "autocast_deprecated")
    at(ac["cuda", True].call_site, "autocast_cuda_deprecated")  # torch.cuda.amp.autocast spelling
    assert ac["cpu", False].dtype == "torch.bfloat16" and ac["cpu", False].enabled
    assert not ac["cuda", True].enabled
    (scaler,) = s.grad_scalers
    at(scaler, "grad_scaler")
    kinds = {w.kind: w for w in s.wrappers}
    at(kinds["DataParallel"].call_site, "data_parallel")
    ddp = kinds["DistributedDataParallel"]
    at(ddp.call_site, "ddp")
    assert ddp.options["bucket_cap_mb"] == 10 and ddp.options["find_unused_parameters"] is True
    assert ddp.options["gradient_as_bucket_view"] is True and ddp.options["static_graph"] is False
    assert ddp.options["backend"] == "gloo" and ddp.module == "Sequential"
    comp = kinds["torch.compile"]
    at(comp.call_site, "compile")
    assert comp.options["mode"] == "reduce-overhead" and comp.options["fullgraph"] is True
    (ec,) = s.empty_cache_calls
    at(ec, "empty_cache")
    assert s.empty_cache_count == 8
    assert s.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert s.device_type == "cpu"


def test_each_rank_of_a_distributed_job_writes_its_own_files(tmp_path):
    """The child bootstrap as torchrun would start it on rank 1 of 2 (WORLD_SIZE, RANK, LOCAL_RANK)."""
    import os
    import subprocess
    import sys
    import time

    from collect_testlib import env

    copy_script("train_small.py", tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = {
        "run_dir": str(run_dir), "t0_mono_ns": time.monotonic_ns(), "cwd": str(tmp_path), "parent_pid": os.getpid(),
        "script_path": str(tmp_path / "train_small.py"), "module": None, "argv": ["train_small.py", "--epochs", "1"],
        "schedule": {"skip_first": 2, "wait": 2, "warmup": 1, "active": 2, "repeat": 1,
                     "record_shapes": False, "with_stack": False, "profile_memory": False},
        "max_steps": None, "cprofile": True, "cprofile_steps": 2,
    }
    e = env()
    e.update({"GPUDOCTOR_CHILD_CONFIG": json.dumps(cfg), "WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"})
    proc = subprocess.run([sys.executable, "-m", "gpudoctor.collect._child"], cwd=tmp_path, env=e,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in run_dir.iterdir())
    assert {"steps.rank1.jsonl", "settings.rank1.json", "profile.rank1.pstats", ".child-state.rank1.json"} <= set(names)
    assert not {"steps.jsonl", "settings.json"} & set(names)
    rows = [json.loads(line) for line in (run_dir / "steps.rank1.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {r["rank"] for r in rows} == {1}
    state = json.loads((run_dir / ".child-state.rank1.json").read_text())
    assert (state["rank"], state["world_size"], state["local_rank"], state["status"]) == (1, 2, 1, "completed")
    (trace,) = state["traces"]
    # the child exports plain JSON; gpudoctor's parent process gzips it under the listed name
    assert trace.endswith(".pt.trace.json.gz") and (run_dir / trace[: -len(".gz")]).is_file()


def test_no_training_steps_is_said_plainly(tmp_path):
    (tmp_path / "hello.py").write_text("import torch\nprint(torch.ones(2).sum().item())\n")
    proc = run_profile("--no-report", "--out", "runs", "hello.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "2.0"
    m = manifest(only_run_dir(tmp_path / "runs"))
    assert m["step_source"] == "none" and m["steps_seen"] == 0
    reason = collected(m, "steps")["reason"]
    assert reason.startswith("no step structure: no optimizer step, backward(), root-module call or DataLoader batch")
    assert "the script ended before second 5" in reason  # too short for the time-based window
    assert "no training steps" in proc.stderr

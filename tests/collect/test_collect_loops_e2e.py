"""`gpudoctor profile` on loops of every shape (tests/collect/scripts/loops.py): each finds
its steps, gets a trace and the diagnosis it deserves; what the script computes is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from collect_testlib import (
    FAST_SCHEDULE,
    collected,
    copy_script,
    env,
    manifest,
    only_run_dir,
    profiler_steps,
    run_profile,
    settings,
    site_lines,
    steps,
)

from gpudoctor.model import Settings

pytestmark = pytest.mark.slow


def _bare(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script, *args], cwd=cwd, env=env(), capture_output=True, text=True, timeout=120)


def _losses(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("loss ")]


def _report(run_dir: Path) -> dict:
    return json.loads((run_dir / "report.json").read_text())


@pytest.fixture(scope="module")
def manual(tmp_path_factory):
    """An LSTM language model updated by hand, batches sliced from a tensor: no optimizer, no DataLoader."""
    work = tmp_path_factory.mktemp("manual")
    copy_script("loops.py", work)
    args = ("--shape", "manual", "--iters", "12", "--print-losses", "--save", "model.pt")
    proc = run_profile("--no-report", "--out", "runs", *FAST_SCHEDULE, "loops.py", "--", *args, cwd=work)
    bare = _bare("loops.py", *args, cwd=work)
    return proc, bare, only_run_dir(work / "runs")


def test_manual_updates_are_marked_by_backward(manual):
    proc, bare, run_dir = manual
    assert proc.returncode == 0, proc.stderr
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("backward", 12)
    assert m["step_source_reason"].endswith("no optimizer object")
    assert m["step_markers"] == [{"marker": "backward", "first_step": 0, "detail": ""}]
    root = m["root_module"]  # calls with grad not counted in a run that trains; no call in eval mode
    assert (root["name"], root["calls"], root["calls_with_grad"], root["eval_calls"]) == ("LM", 12, None, 0)
    rows = steps(run_dir)
    assert [r["index"] for r in rows] == list(range(12))
    assert all(r["marker"] == "backward" and r["micro_batches"] == 1 for r in rows)
    assert all(r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["optimizer_ns"] == 0 for r in rows)
    first = sorted(m["traces"])[0]
    assert profiler_steps(run_dir / first) == [3, 4, 5]
    assert "marked by loss.backward()" in proc.stderr


def test_a_marker_changes_nothing_the_script_computes(manual):
    proc, bare, run_dir = manual
    assert bare.returncode == 0, bare.stderr
    losses = _losses(proc.stdout)
    assert len(losses) == 12 and losses == _losses(bare.stdout)
    # torch.save(model) pickles the module: the script's own class is watched by wrapping its
    # forward on the class (nothing on the instance, nothing in the file)
    assert "hooks: live 0, saved 0, class forward wrapped True, loaded same True" in proc.stdout
    assert "hooks: live 0, saved 0, class forward wrapped False, loaded same True" in bare.stdout


def test_evaluation_without_no_grad_is_marked_by_the_root_module_and_diagnosed(tmp_path):
    script = copy_script("loops.py", tmp_path)
    proc = run_profile("--out", "runs", "--format", "json", *FAST_SCHEDULE, "loops.py", "--", "--shape", "eval", "--iters", "12",
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("module", 12)
    # the shape probe in __init__ (a submodule called alone) is not the root
    root = m["root_module"]
    assert (root["name"], root["calls"], root["calls_with_grad"], root["eval_calls_with_grad"]) == ("Classifier", 12, 12, 12)
    line = site_lines(script)["eval_loop"]
    assert root["first_grad_call_site"] == {"file": "loops.py", "line": line, "function": "evaluate"}
    assert all(r["marker"] == "module" and r["forward_ns"] > 0 for r in steps(run_dir))
    assert m["traces"] and collected(m, "torch.profiler")["ok"]
    report = _report(run_dir)
    gd701 = [f for f in report["findings"] if f["code"] == "GD701"]
    assert gd701 and "12 of 12 calls of Classifier" in gd701[0]["message"]
    assert (gd701[0]["location"]["file"], gd701[0]["location"]["line"]) == ("loops.py", line)  # the fix's file:line
    marker = [s for s in report["summary"] if s["key"] == "step_marker"]
    assert marker and marker[0]["value"].startswith("each call of the root module (Classifier) ends a step")


@pytest.fixture(scope="module")
def accum(tmp_path_factory):
    """Gradient accumulation (4 micro-batches per optimizer step) over a DataLoader with a slow collate_fn."""
    work = tmp_path_factory.mktemp("accum")
    copy_script("loops.py", work)
    args = ("--shape", "accum", "--iters", "24", "--accum", "4", "--collate-ms", "8", "--print-losses")
    proc = run_profile("--out", "runs", "--format", "json", *FAST_SCHEDULE, "loops.py", "--", *args, cwd=work)
    bare = _bare("loops.py", *args, cwd=work)
    return proc, bare, only_run_dir(work / "runs")


def test_gradient_accumulation_steps_are_optimizer_steps(accum):
    proc, bare, run_dir = accum
    assert proc.returncode == 0, proc.stderr
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("optimizer", 6)
    assert "gradient accumulation: 4 micro-batches" in m["step_source_reason"]
    assert [(r["micro_batches"], r["batches"]) for r in steps(run_dir)] == [(4, 4)] * 6
    assert _losses(proc.stdout) == _losses(bare.stdout) and len(_losses(bare.stdout)) == 24


def test_gradient_accumulation_with_a_slow_collate_is_a_dataloader_stall(accum):
    proc, bare, run_dir = accum
    report = _report(run_dir)
    assert report["findings"][0]["code"] == "GD201", [f["code"] for f in report["findings"]]
    msg = report["findings"][0]["message"]
    assert "optimizer step over its 4 micro-batches" in msg and "per batch" in msg


def test_phases_inside_the_optimizer_step_are_their_own(tmp_path):
    """LBFGS' step(closure) runs the forward and backward() inside the optimizer's phase: the real
    hooks (not their inline path) give each its own time and take it off the optimizer's."""
    copy_script("loops.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "--skip-first", "1000", "--no-cprofile", "loops.py", "--",
                       "--shape", "lbfgs", "--iters", "6", "--phase-ms", "40", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = steps(only_run_dir(tmp_path / "runs"))
    assert len(rows) == 6 and all(r["marker"] == "optimizer" for r in rows)
    for r in rows[1:]:
        assert r["forward_ns"] >= 40e6 and r["backward_ns"] >= 40e6, r
        # had the optimizer's time included them, it would be over 80 ms
        assert r["optimizer_ns"] < 40e6 and r["forward_ns"] + r["backward_ns"] + r["optimizer_ns"] <= r["wall_ns"], r


NO_WINDOWS = ("--skip-first", "1000000000", "--no-cprofile", "--time-window", "off")


@pytest.mark.parametrize(("shape", "marker"), [("accum", "optimizer"), ("manual", "backward")])
def test_steps_the_hooks_close_inline_are_every_one_recorded(tmp_path, shape, marker):
    """With no instrument due, the optimizer's and backward()'s hooks close the steps themselves
    (StepTracker.fast_close, inlined): every step is a row, in order, with its own phases and
    batches; the rows between two getrusage reads carry no CPU figures (they took that path)."""
    copy_script("loops.py", tmp_path)
    n = 240
    args = ("--shape", shape, "--iters", str(n), *(("--accum", "1") if shape == "accum" else ()))
    proc = run_profile("--no-report", "--out", "runs", *NO_WINDOWS, "loops.py", "--", *args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = steps(only_run_dir(tmp_path / "runs"))
    assert [r["index"] for r in rows] == list(range(n)) and {r["marker"] for r in rows} == {marker}
    for a, b in zip(rows, rows[1:], strict=False):
        assert a["start_ns"] + a["wall_ns"] <= b["start_ns"], (a, b)
    for r in rows[1:]:
        assert r["forward_ns"] > 0 and r["backward_ns"] > 0 and r["micro_batches"] == 1, r
        assert r["forward_ns"] + r["backward_ns"] + r["optimizer_ns"] + r["data_wait_ns"] <= r["wall_ns"], r
        if marker == "optimizer":
            assert r["optimizer_ns"] > 0 and r["batches"] == 1 and r["epoch"] == 0, r
        else:
            assert r["optimizer_ns"] == 0 and r["batches"] == 0 and r["epoch"] is None, r
    # getrusage is read at most every 20 ms of the clock (RUSAGE_EVERY_NS); the other rows take the fast path
    read = [r for r in rows if r["cpu_steps"] is not None]
    span_ns = rows[-1]["start_ns"] + rows[-1]["wall_ns"] - rows[0]["start_ns"]
    assert len(read) <= span_ns / 20e6 + 2, f"{len(read)} of {n} rows read getrusage over {span_ns / 1e6:.0f} ms"
    # each getrusage read covers the steps since the one before (those after the last read have none)
    assert sum(r["cpu_steps"] for r in read) == read[-1]["index"] + 1


def test_two_optimizers_stepping_in_one_iteration_are_one_step_not_accumulation(tmp_path):
    """A DCGAN-shaped loop: the discriminator's optimizer steps after two backward() calls (real and
    fake), the generator's after one. Each iteration is one step of one batch; the three backward()
    calls are the two optimizers' own, not three micro-batches of gradient accumulation (steps
    inside the profiler's windows take the tracker's slow path, the others its inline one)."""
    copy_script("loops.py", tmp_path)
    proc = run_profile("--out", "runs", "--format", "json", *FAST_SCHEDULE, "loops.py", "--",
                       "--shape", "gan", "--iters", "30", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("optimizer", 30)
    assert "accumulation: " not in m["step_source_reason"] and "micro-batches" not in m["step_source_reason"]
    assert "another optimizer (Adam) also steps in each iteration" in m["step_source_reason"]
    rows = steps(run_dir)
    assert {r["window"] for r in rows[1:]} >= {"", "active"}  # both paths wrote rows
    # step 0 is the first iteration's discriminator part (before the generator's optimizer ever stepped)
    assert [(r["micro_batches"], r["batches"]) for r in rows[1:]] == [(1, 1)] * 29
    # the DataLoader's call passed the dataset and batch_size: prefetch_factor and the rest are its defaults
    assert [d["passed_args"] for d in settings(run_dir)["dataloaders"]] == [["dataset", "batch_size"]]
    report = _report(run_dir)
    assert "gradient accumulation: " not in json.dumps(report)
    assert "micro-batches" not in json.dumps(report["findings"])


@pytest.mark.parametrize("no_grad", [False, True], ids=["with-grad", "no-grad"])
def test_an_evaluation_after_training_is_judged_as_evaluation(tmp_path, no_grad):
    """Training epochs, then an evaluation pass in eval mode: GD701 judges the evaluation (not "the
    run trains") and points at the line that calls the model."""
    script = copy_script("loops.py", tmp_path)
    args = ("--shape", "train_eval", "--iters", "8", "--epochs", "2", "--eval-batches", "5")
    proc = run_profile("--out", "runs", "--format", "json", *FAST_SCHEDULE, "loops.py", "--", *args,
                       *(("--eval-no-grad",) if no_grad else ()), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("optimizer", 16)
    root = m["root_module"]
    assert (root["calls"], root["eval_calls"], root["eval_calls_with_grad"]) == (21, 5, 0 if no_grad else 5)
    report = _report(run_dir)
    item = next(i for i in report["checklist"] if "GD701" in i["codes"])
    assert "the run trains" not in item["reason"] or "its evaluation" in item["reason"]
    if no_grad:
        assert not any(f["code"] == "GD701" for f in report["findings"])
        assert item["status"] == "applied" and "without autograd recording" in item["reason"]
        return
    line = site_lines(script)["eval_call"]
    (f,) = [f for f in report["findings"] if f["code"] == "GD701"]
    assert f["location"]["file"] == "loops.py" and f["location"]["line"] == line
    assert "5 of the 5 calls of Classifier in eval mode" in f["message"] and f"loops.py:{line}" in f["fix"]["instruction"]
    assert item["status"] == "recommended"


@pytest.mark.parametrize("eval_grad", [False, True], ids=["no-grad", "with-grad"])
def test_word_language_model_evaluation_is_counted_whole_and_judged(tmp_path, eval_grad):
    """word_language_model's shape: epochs of train() (model.train(), manual updates) and evaluate()
    (model.eval(), torch.no_grad()), then the model saved, loaded back and evaluated on the test set. GD701
    said "every one of the 10 calls of RNNModel ran in eval mode" (3.11: the calls counted were the reloaded
    object's alone, 19 in eval mode) and "never called RNNModel in eval mode" (3.12: nothing was counted once
    step tracking stopped). The counts are exact on every Python."""
    copy_script("loops.py", tmp_path)
    iters, epochs, evals = 12, 3, 4
    proc = run_profile("--out", "runs", "--format", "json", *FAST_SCHEDULE, "loops.py", "--shape", "word_lm",
                       "--iters", str(iters), "--epochs", str(epochs), "--eval-batches", str(evals),
                       *(("--eval-grad",) if eval_grad else ()), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["step_source"] == "backward"
    eval_calls = evals * (epochs + 1)  # after each epoch, and the test set on the reloaded model
    root = m["root_module"]
    assert (root["name"], root["calls"], root["eval_calls"], root["eval_calls_with_grad"]) == (
        "LM", iters * epochs + eval_calls, eval_calls, eval_calls if eval_grad else 0)
    report = _report(run_dir)
    item = next(i for i in report["checklist"] if "GD701" in i["codes"])
    if not eval_grad:
        assert not any(f["code"] == "GD701" for f in report["findings"])
        assert item["status"] == "applied", item
        assert f"its evaluation ({eval_calls} calls of LM in eval mode) runs without autograd" in item["reason"]
        return
    (f,) = [f for f in report["findings"] if f["code"] == "GD701"]
    assert f"{eval_calls} of the {eval_calls} calls of LM in eval mode" in f["message"]
    assert f["location"]["line"] == site_lines(tmp_path / "loops.py")["word_lm_eval"]


def test_an_optimizer_step_the_grad_scaler_skips_is_still_a_step(tmp_path):
    """GradScaler.step skips optimizer.step() when the gradients are not finite: that iteration is
    still a step, whichever path (inline or not) closed the ones around it."""
    copy_script("loops.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", *NO_WINDOWS, "loops.py", "--",
                       "--shape", "scaler", "--iters", "60", "--inf-every", "7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "scaler skipped 8" in proc.stdout
    rows = steps(only_run_dir(tmp_path / "runs"))
    assert [r["index"] for r in rows] == list(range(60)) and {r["marker"] for r in rows} == {"optimizer"}
    assert all(r["batches"] == 1 for r in rows[1:])
    skipped = [r for r in rows[1:] if r["optimizer_ns"] == 0]
    assert [r["index"] for r in skipped] == [i for i in range(1, 60) if i % 7 == 6]


def test_an_autocast_site_that_appears_late_in_a_long_amp_loop_is_noted(tmp_path):
    """After its first autocasts, a run looks at one in 17 (settings_hooks.AUTOCAST_EVERY): a site that
    first runs late, taking turns with the training one, is still noted, at its own line."""
    script = copy_script("loops.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", *NO_WINDOWS, "loops.py", "--",
                       "--shape", "amp", "--iters", "400", "--eval-from", "300", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = site_lines(script)
    s = Settings.from_dict(settings(only_run_dir(tmp_path / "runs")))
    got = sorted((a.call_site.file, a.call_site.line, a.dtype) for a in s.autocast)
    assert got == [("loops.py", lines["train_autocast"], "torch.bfloat16"),
                   ("loops.py", lines["eval_autocast"], "torch.bfloat16")]


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_script_that_raises_inside_a_marked_region(tmp_path, where):
    copy_script("loops.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", *FAST_SCHEDULE, "loops.py", "--",
                       "--shape", "manual", "--iters", "12", "--raise-in", where, "--raise-at", "5", cwd=tmp_path)
    assert proc.returncode == 1
    assert f"Planted: planted failure in {where} at iteration 5" in proc.stderr  # the script's own traceback
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["status"] == "failed" and m["exception"]["type"] == "__main__.Planted"
    assert [r["index"] for r in steps(run_dir)] == [0, 1, 2, 3, 4]  # the steps before; not the one that raised
    assert m["traces"]  # the window in progress (steps 2..5) was exported as the script unwound


def test_no_step_structure_gets_a_time_based_window(tmp_path):
    copy_script("loops.py", tmp_path)
    proc = run_profile("--out", "runs", "--time-window", "0.5:1.5", "loops.py", "--", "--shape", "tensors", "--seconds", "2.5",
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert (m["step_source"], m["steps_seen"]) == ("time", 0)
    start, end = m["time_window_s"]
    # the window opens and closes from a timer thread through the main thread: a loaded machine delays both
    assert 0.5 <= start < 1.5 and 1.4 <= end <= 2.6 and end > start
    (trace,) = m["traces"]
    assert trace.endswith(".00000000.pt.trace.json.gz") and (run_dir / trace).is_file()
    assert (run_dir / "profile.pstats").stat().st_size > 0
    assert "a time-based window" in collected(m, "torch.profiler")["detail"]
    assert "a time-based window" in collected(m, "cprofile")["detail"]
    assert "no step structure" in collected(m, "steps")["reason"]
    marker = [s for s in _report(run_dir)["summary"] if s["key"] == "step_marker"]
    assert marker and "recorded from second" in marker[0]["value"]
    assert not any(p.name.startswith(".") for p in run_dir.iterdir())


def test_a_script_that_profiles_itself_without_exporting(tmp_path):
    """It only prints key_averages(): gpudoctor gives way, then exports what it recorded."""
    copy_script("own_profiler_quiet.py", tmp_path)
    proc = run_profile("--out", "runs", "--format", "json", "own_profiler_quiet.py", "--", "plain", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "own_profiler_quiet: done" in proc.stdout
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["profiler_owner"] == "user" and len(m["traces"]) == 1
    detail = collected(m, "torch.profiler")["detail"]
    assert "two profilers cannot record at once" in detail and "1 trace(s) it recorded but did not export" in detail
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["own_profiler_quiet.py"]  # nothing left beside it
    summary = {s["key"]: s["value"] for s in _report(run_dir)["summary"]}
    assert summary["trace_source"].startswith("the script's own torch.profiler")


@pytest.mark.parametrize("kind", ["sequential", "net"])
def test_model_operations_work_on_a_watched_root_module(tmp_path, kind):
    """deepcopy, TorchScript, DataParallel, a state_dict round trip and torch.save, with the root
    module watched: hooked on the instance (a torch class) or its class's forward wrapped (the
    script's own class)."""
    copy_script("model_ops.py", tmp_path)
    proc = run_profile("--no-report", "--out", "runs", "model_ops.py", *(["--", "net"] if kind == "net" else []),
                       cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    hooks = 2 if kind == "sequential" else 0
    assert seen == {"copied_hooks": 0, "data_parallel_same": True, "live_hooks": hooks, "live_hooks_after_script": hooks,
                    "scripted_same": True, "state_dict_same": True, "saved_same": True, "saved_hooks": 0,
                    "signature": ["input"] if kind == "sequential" else ["x"], "class_forward_wrapped": kind == "net"}
    (run_dir,) = (tmp_path / "runs").iterdir()
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["forward_ns"] for r in rows[1:])  # the forward is timed either way

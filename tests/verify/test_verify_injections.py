"""Every injectable rule: its fix, applied to a trial run, changes exactly that setting in the child.

For each rule, a run where it fires is built from the settings that a baseline run of
``scripts/inject_target.py`` really recorded (so the call sites are real); the rule's
``inject`` gives the changes; a trial run of the same script with them is read back
from its ``settings.json`` and compared with the baseline's, field by field: the
fields the fix names change, every other field stays, and ``injected`` says each
change took effect.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rule_builders import (
    MS,
    cpu_manifest,
    kernels,
    manifest,
    proc_samples,
    run,
    steps,
    trace,
    transfer,
    utilization,
)

from gpudoctor.collect import ProfileOptions, profile_run
from gpudoctor.config import Thresholds
from gpudoctor.model import GapCause, Injection, RunData, Samples, Settings
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.registry import all_rules, get

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).parent / "scripts" / "inject_target.py"
TRIAL_STEPS = 6


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("inject")
    shutil.copy(SCRIPT, d / SCRIPT.name)
    return d


def _trial(work: Path, name: str, workers: int, injections: tuple[Injection, ...] = ()) -> dict[str, Any]:
    run_dir = work / "runs" / name
    result = profile_run(ProfileOptions(
        script=SCRIPT.name, args=("--workers", str(workers)), cwd=str(work), run_dir=run_dir,
        max_steps=TRIAL_STEPS, torch_profiler=False, cprofile=False, summary=False, output_log=True,
        injections=injections,
    ))
    assert result.exit_code == 0, (run_dir / "output.log").read_text()
    return json.loads((run_dir / "settings.json").read_text())


_baselines: dict[int, dict[str, Any]] = {}


def _baseline(work: Path, workers: int) -> dict[str, Any]:
    if workers not in _baselines:
        _baselines[workers] = _trial(work, f"baseline-w{workers}", workers)
    return _baselines[workers]


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """settings.json as {path: value}; lists of named things (flags) keyed by their name."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(obj, list) and obj and all(isinstance(x, dict) and "name" in x for x in obj):
        for x in obj:
            out.update(_flat(x, f"{prefix}[{x['name']}]"))
    elif isinstance(obj, list) and obj:
        for i, x in enumerate(obj):
            out.update(_flat(x, f"{prefix}[{i}]"))
    else:
        out[prefix] = obj
    return out


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """The settings that differ; a DataLoader's ``passed_args`` (the arguments its call passed) is left
    out: an injected argument is passed to the call like the script's own, and is in ``injected``."""
    a = _flat({k: v for k, v in before.items() if k != "injected"})
    b = _flat({k: v for k, v in after.items() if k != "injected"})
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>") and ".passed_args[" not in k}


# --------------------------------------------------------------------------- runs where each rule fires


def _gd201(s: Settings) -> RunData:
    return run(manifest=cpu_manifest(cpu_count=2), settings=s, steps=steps(20, 100.0, wait_ms=60.0))


def _gd202(s: Settings) -> RunData:
    dl = dataclasses.replace(s.dataloaders[0], iterations_started=4)
    return run(manifest=cpu_manifest(), settings=dataclasses.replace(s, dataloaders=(dl,)),
               steps=steps(20, 100.0, 1.0, epochs=4, first_wait_ms=500.0))


def _gd204(s: Settings) -> RunData:
    # 2 cores: the training process wants 3 (1 on a core, 2 waiting), the worker 1.2
    samples = proc_samples(100.0, runq_wait_pct=200.0) + proc_samples(80.0, role="worker", pid=200, runq_wait_pct=40.0)
    return run(manifest=cpu_manifest(cpu_count=2), settings=dataclasses.replace(s, cpu_count=2),
               steps=steps(), samples=Samples(process=samples))


def _gd301(s: Settings) -> RunData:
    m = trace(transfers=(transfer("HtoD", "pageable", count=61, nbytes=2_300_000_000, dur_ns=630 * MS // 20),))
    return run(metrics=(m,), settings=s)


def _gd302(s: Settings) -> RunData:
    m = trace(
        transfers=(transfer("HtoD", "pageable", count=10, nbytes=40 * 10**6, dur_ns=8 * MS,
                            blocking_count=10, blocking_dur_ns=8 * MS),),
        utilization=(utilization(30.0, causes={GapCause.SYNC: 0.4, GapCause.OTHER: 0.6}),),
    )
    return run(metrics=(m,), settings=s)


def _gd402(s: Settings) -> RunData:
    k = kernels(eligible_dtypes_known=True, fp32_eligible_pct_of_gpu=70.0, tensor_core_pct=0.0, conv_kernel_ns=0)
    return run(metrics=(trace(kernels=k),), settings=s)


def _gd403(s: Settings) -> RunData:
    m = trace(kernels=kernels(conv_kernel_ns=20 * MS), conv_shapes_total=20, conv_shapes_max_per_step=20)
    return run(metrics=(m,), settings=s)


def _gd404(s: Settings) -> RunData:
    m = trace(kernels=kernels(optimizer_kernels_per_step=1600.0), breakdown_mean_pct={"optimizer": 18.0})
    return run(metrics=(m,), settings=s)


def _gd502(s: Settings) -> RunData:
    # one empty_cache() per step (the last step stops at opt.step(), before its call)
    return run(manifest=manifest(steps_seen=s.empty_cache_count), settings=s, metrics=(trace(),))


def _gd503(s: Settings) -> RunData:
    return run(manifest=cpu_manifest(), settings=s, steps=steps(20, 100.0, sys_ms=25.0, user_ms=70.0, faults=5000))


DL = "dataloaders[0]"
FLAG = "flags[{}].value"
# code: (workers, run where it fires, fields of settings.json the fix may change, kinds of injection)
CASES: dict[str, tuple[int, Callable[[Settings], RunData], set[str], set[str]]] = {
    # prefetch_factor and the start method are recorded only for a DataLoader with workers; a CPU run's load
    # (unmeasured here: sized as computing) gets the worker's core from the training's threads (torch's default,
    # one per core, want more than the 2 cores beside it)
    "GD201": (0, _gd201, {f"{DL}.num_workers", f"{DL}.persistent_workers", f"{DL}.prefetch_factor",
                          f"{DL}.multiprocessing_context", "num_threads", FLAG.format("torch.set_num_threads")},
              {"dataloader", "threads"}),
    "GD202": (1, _gd202, {f"{DL}.persistent_workers"}, {"dataloader"}),
    "GD204": (1, _gd204, {f"{DL}.has_worker_init_fn", "num_threads", FLAG.format("torch.set_num_threads")},
              {"worker_threads", "threads"}),
    "GD301": (0, _gd301, {f"{DL}.pin_memory"}, {"dataloader", "non_blocking"}),
    "GD302": (0, _gd302, {f"{DL}.pin_memory"}, {"dataloader", "non_blocking"}),
    "GD402": (0, _gd402, {FLAG.format(n) for n in ("torch.float32_matmul_precision",
                                                   "torch.backends.cuda.matmul.allow_tf32",
                                                   "torch.backends.cuda.matmul.fp32_precision")}, {"flag"}),
    "GD403": (0, _gd403, {FLAG.format("torch.backends.cudnn.benchmark")}, {"flag"}),
    "GD404": (0, _gd404, {"optimizers[0].fused"}, {"optimizer"}),
    # a skipped empty_cache() is no longer counted nor located
    "GD502": (0, _gd502, {"empty_cache_count", "empty_cache_calls", "empty_cache_calls[0].file",
                          "empty_cache_calls[0].line", "empty_cache_calls[0].function"}, {"skip_call"}),
    "GD503": (0, _gd503, {"env.MALLOC_MMAP_THRESHOLD_", "env.MALLOC_TRIM_THRESHOLD_"}, {"env"}),
}


def test_every_injectable_rule_has_a_case() -> None:
    assert {r.code for r in all_rules() if r.inject is not None} == set(CASES)


def test_every_rule_says_whether_verify_can_apply_its_fix() -> None:
    for r in all_rules():
        assert (r.inject is not None) != bool(r.not_injectable), r.code


@pytest.mark.parametrize("code", sorted(CASES))
def test_injection_changes_that_setting_and_nothing_else(work: Path, code: str) -> None:
    workers, build, expected, kinds = CASES[code]
    before = _baseline(work, workers)
    data = build(Settings.from_dict(before))
    rule = get(code)
    ctx = RuleContext(data, Thresholds()).for_rule(rule.code, rule.name)
    (finding,) = rule.check(ctx).findings
    changes = rule.inject(finding, ctx)
    assert not isinstance(changes, str), changes
    assert {c.kind for c in changes} == kinds
    after = _trial(work, code, workers, changes)
    assert _changed(before, after) == expected
    applied = after["injected"]
    assert [a["injection"] for a in applied] == [c.to_dict() for c in changes]
    assert all(a["applied"] > 0 for a in applied), applied
    assert before["injected"] == []


def test_the_values_read_back_are_the_fix(work: Path) -> None:
    """Spot checks of the values behind the changed fields (the test above checks which fields)."""
    s = {code: json.loads((work / "runs" / code / "settings.json").read_text())
         for code in CASES if (work / "runs" / code / "settings.json").is_file()}
    if len(s) < len(CASES):
        pytest.skip("runs after the parametrized injection tests")
    flags = {code: {f["name"]: f["value"] for f in v["flags"]} for code, v in s.items()}
    assert s["GD201"]["dataloaders"][0]["num_workers"] == 1 and s["GD201"]["dataloaders"][0]["persistent_workers"]
    assert s["GD201"]["num_threads"] == 1
    assert s["GD202"]["dataloaders"][0]["persistent_workers"] is True
    assert s["GD204"]["num_threads"] == 1 and s["GD204"]["dataloaders"][0]["has_worker_init_fn"]
    assert s["GD301"]["dataloaders"][0]["pin_memory"] is True
    nb = next(a for a in s["GD301"]["injected"] if a["injection"]["kind"] == "non_blocking")
    assert nb["applied"] == TRIAL_STEPS  # one host→device copy of a fresh batch per step
    assert flags["GD402"]["torch.float32_matmul_precision"] == "high"
    assert flags["GD403"]["torch.backends.cudnn.benchmark"] is True
    assert s["GD404"]["optimizers"][0]["fused"] is True
    assert s["GD502"]["empty_cache_count"] == 0
    assert s["GD503"]["env"]["MALLOC_MMAP_THRESHOLD_"] == "4294967296"
    # the script's own writes were overridden, and the account says so
    bench = next(a for a in s["GD403"]["injected"])
    assert bench["applied"] >= 2 and "set it to False" in bench["note"]

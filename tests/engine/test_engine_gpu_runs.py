"""``gpudoctor analyze`` of the recorded GPU runs (tests/fixtures/gpu, one H200): the advice follows the
timeline that limits the loop (issue 36's "Done when").

- the FP32 probe (the device 54 ms behind a 2 ms host step): precision caps its GEMMs (GD405), and no
  idle, launch-bound or batch-size finding (GD101, GD103, GD104) at warning or above;
- the BF16 probe: neither GD405 nor GD103 nor GD104 at warning or above;
- cudnn_benchmark_off (device-bound, FP32 SIMT convolutions at a tenth of the rate of its TF32 ones):
  GD403 ranks first, no GD103 at warning or above;
- every sample's planted finding (``index.json``'s ``expected``) at warning or above, where the
  recorded run measures its cost at or above the warning share: the exceptions below each assert
  the measurement that makes them one;
- no launch-bound or batch-size finding on a run whose GPU is busy 85% of its steps or more.
"""

from __future__ import annotations

import ast
import re

import pytest

from gpudoctor.config import Thresholds
from gpudoctor.model import Severity
from gpudoctor.model.metrics import Component

ALARM = (Severity.ERROR, Severity.WARNING)
BUSY_DEVICE_PCT = 85.0


def _alarms(report) -> set[str]:
    return {f.code for f in report.findings if f.severity in ALARM}


def _busy_pct(report) -> float:
    return 100.0 - report.account.ledger.idle_pct


def test_the_fp32_probe_is_told_about_precision_not_launches(gpu_report) -> None:
    _, report = gpu_report("probe_fp32_matmul")
    alarms = _alarms(report)
    assert "GD405" in alarms
    assert not alarms & {"GD101", "GD103", "GD104"}, alarms
    (f,) = [f for f in report.findings if f.code == "GD405"]
    # the headline of the precision-capped time names the fixes that claim it
    assert "precision, not memory, caps it" in f.message and "the fixes are findings GD40" in f.message


def test_the_bf16_probe_gets_no_precision_launch_or_batch_alarm(gpu_report) -> None:
    _, report = gpu_report("probe_bf16_matmul")
    assert not _alarms(report) & {"GD405", "GD103", "GD104"}, _alarms(report)
    assert _busy_pct(report) >= 90.0


def test_cudnn_benchmark_off_leads_with_cudnn_benchmark(gpu_report) -> None:
    _, report = gpu_report("cudnn_benchmark_off")
    assert report.findings[0].code == "GD403", [f.code for f in report.findings]
    assert report.account.actions[0].code == "GD403"
    assert "GD103" not in _alarms(report)
    (f,) = [f for f in report.findings if f.code == "GD403"]
    assert "this GPU" in f.gain.expected_note  # measured on the run's own convolutions, not the 10% estimate


def test_no_launch_or_batch_advice_where_the_gpu_is_busy(gpu_index, gpu_report) -> None:
    busy = 0
    for name in sorted(n for n, e in gpu_index.items() if e.get("trace")):
        _, report = gpu_report(name)
        if _busy_pct(report) >= BUSY_DEVICE_PCT:
            busy += 1
            assert not {f.code for f in report.findings} & {"GD103", "GD104"}, name
    assert busy >= 3


# --------------------------------------------------------------------------- the planted findings


def _speedup_gpus(root, name: str) -> int:
    """The GPUs a sample's fix needs to show its gain (its docstring's "Speedup: needs N+ GPUs"), 1 else."""
    script = root / "sample_scripts" / f"{name}.py"
    if not script.is_file():
        return 1
    doc = ast.get_docstring(ast.parse(script.read_text(encoding="utf-8"))) or ""
    m = re.search(r"^Speedup:.*?(\d+)\+?\s*GPU", doc, re.MULTILINE | re.IGNORECASE)
    return int(m.group(1)) if m else 1


def _sync_cost_pct(run) -> tuple[float, float]:
    """GD102's measured cost on a run: the host's time blocked in synchronizations, and the GPU idle in
    and after them (the ledger's sync_wait and the idle of gaps a sync began), % of the account's step."""
    (m,) = run.metrics
    led = m.ledger
    blocked = 100.0 * (m.syncs.total_ns if m.syncs else 0) / led.total_ns
    drained = led.ns(Component.SYNC_WAIT) + sum(
        s.after_sync_ns for s in led.slices if s.component in (Component.LAUNCH_OVERHEAD.value, Component.OTHER_CPU.value))
    return blocked, 100.0 * drained / led.total_ns


def test_every_planted_finding_is_an_alarm_where_the_run_measures_its_cost(gpu_index, gpu_report, root) -> None:
    """Each run's planted findings at warning or above, with three kinds of exception, each asserting
    what the recording measured:

    - a fix whose gain needs more GPUs than the recording had (data_parallel: DataParallel on one GPU
      only calls the module; GD601 documents info there): present, any severity;
    - a finding whose time the account granted to another alarm that owns the same part (pageable
      copies: the blocking copies' sync wait is GD102's, docs/account.md): present, "included in" it;
    - GD102 where the run's syncs cost under the warning share of the step, on the host (blocked) and
      on the device (idle in and after them): on the H200, host_sync_every_step's device finishes each
      step's work (2.9 ms) long before the host (10.8 ms) reaches ``.item()``, each sync blocks ~10 µs,
      and removing them cannot shorten the step by the warning share."""
    warn = Thresholds().warning_share_pct
    checked = 0
    for name, entry in sorted(gpu_index.items()):
        if not entry.get("trace"):
            continue  # the run left no trace (compiled_tiny_batch: killed by SIGSEGV)
        run, report = gpu_report(name)
        alarms = _alarms(report)
        by_code = {f.code: f for f in report.findings}
        gpus = len(run.manifest.devices) if run.manifest is not None else 0
        for code in entry.get("expected", []):
            checked += 1
            if code in alarms:
                continue
            f = by_code.get(code)
            if gpus < _speedup_gpus(root, name):
                assert f is not None, (name, code)
            elif f is not None and f.gain.included_in:
                assert set(f.gain.included_in) <= alarms, (name, code, f.gain.included_in)
            elif code == "GD102":
                blocked, drained = _sync_cost_pct(run)
                assert blocked < warn and drained < warn, (name, blocked, drained)
            else:
                pytest.fail(f"{name}: the planted {code} is {f.severity.value if f else 'absent'}")
    assert checked >= 12

"""GD601 (data-parallel), GD701 (eval-with-grad), GD702 (loss-on-cpu)."""

from __future__ import annotations

from rule_builders import (
    GB,
    MS,
    SITE,
    NameStat,
    OptimizerSetting,
    WrapSetting,
    cpu_manifest,
    cpu_trace,
    judge,
    manifest,
    run,
    settings,
    trace,
    transfer,
)

from gpudoctor.model import CallSite, Device, RootModuleUse, Severity
from gpudoctor.rules.results import Verdict

# ---------------------------------------------------------------- GD601 data-parallel


def _dp_run(n_gpus: int, kind: str = "DataParallel"):
    devs = tuple(Device(i, "NVIDIA A100", 80 * GB, "8.0") for i in range(n_gpus))
    return run(manifest=manifest(devices=devs), settings=settings(wrappers=(WrapSetting(kind, SITE, "ResNet"),)))


def test_gd601_fires_on_data_parallel():
    (f,) = judge("GD601", _dp_run(4)).findings
    assert "nn.DataParallel wraps ResNet at train.py:31 on 4 GPU(s)" in f.message
    assert "DDP(" in f.fix.after and "torchrun" in f.fix.after
    assert f.severity == Severity.WARNING and f.gain.share_pct is None


def test_gd601_is_info_on_one_gpu():
    (f,) = judge("GD601", _dp_run(1)).findings
    assert f.severity == Severity.INFO


def test_gd601_quiet_with_ddp():
    assert judge("GD601", _dp_run(4, "DistributedDataParallel")).verdict == Verdict.FINE


def test_gd601_not_applicable_without_wrapper():
    assert judge("GD601", run(settings=settings())).verdict == Verdict.NOT_APPLICABLE


# ---------------------------------------------------------------- GD701 eval-with-grad


def test_gd701_fires_on_inference_with_autograd():
    data = run(manifest=manifest(step_source="dataloader"), settings=settings(optimizers=()),
               metrics=(trace(autograd_forward_ops=420, backward_ops=0, optimizer_steps=0),))
    (f,) = judge("GD701", data).findings
    assert "420" in f.message and "inference_mode" in f.fix.after


def test_gd701_fires_on_a_bare_eval_trace_on_cpu():
    m = cpu_trace(autograd_forward_ops=50, backward_ops=0, optimizer_steps=0)
    (f,) = judge("GD701", run(metrics=(m,))).findings
    assert "no Optimizer.step" in f.message


def test_gd701_quiet_under_no_grad():
    data = run(manifest=manifest(step_source="dataloader"), settings=settings(optimizers=()),
               metrics=(trace(autograd_forward_ops=0),))
    assert judge("GD701", data).verdict == Verdict.FINE


def test_gd701_not_applicable_when_training():
    opt = OptimizerSetting(SITE, "torch.optim.SGD", None, None)
    data = run(manifest=manifest(), settings=settings(optimizers=(opt,)), metrics=(trace(autograd_forward_ops=500),))
    assert judge("GD701", data).verdict == Verdict.NOT_APPLICABLE


EVAL_SITE = CallSite("train.py", 88, "validate")


def _training_with_eval(calls: int = 120, eval_calls: int | None = 20, eval_with_grad: int | None = 20):
    root = RootModuleUse("ResNet", calls=calls, calls_with_grad=None, eval_calls=eval_calls,
                         eval_calls_with_grad=eval_with_grad, first_grad_call_site=SITE,
                         eval_grad_call_site=EVAL_SITE if eval_with_grad else None)
    opt = OptimizerSetting(SITE, "torch.optim.SGD", None, None)
    return run(manifest=manifest(root_module=root), settings=settings(optimizers=(opt,)),
               metrics=(trace(autograd_forward_ops=500),))


def test_gd701_judges_an_evaluation_inside_a_training_run():
    """model.eval() then forward passes with grad on, after (or between) training epochs: judged as
    the evaluation it is, at the line that made the first such call."""
    (f,) = judge("GD701", _training_with_eval()).findings
    assert "evaluation inside a training run records autograd: 20 of the 20 calls of ResNet in eval mode" in f.message
    assert (f.location.file, f.location.line) == ("train.py", 88)
    assert "train.py:88" in f.fix.instruction and "inference_mode" in f.fix.after


def test_gd701_an_evaluation_under_no_grad_in_a_training_run_is_applied():
    res = judge("GD701", _training_with_eval(eval_with_grad=0))
    assert res.verdict == Verdict.FINE and res.applied and "without autograd recording" in res.reason


def test_gd701_a_training_run_without_evaluation_or_record():
    assert judge("GD701", _training_with_eval(eval_calls=0, eval_with_grad=0)).verdict == Verdict.NOT_APPLICABLE
    old = judge("GD701", _training_with_eval(eval_calls=None, eval_with_grad=None))  # recorded before the counts
    assert old.verdict == Verdict.NOT_APPLICABLE and "the run trains" in old.reason
    # every call in eval mode, the training ones too: nothing tells the evaluation apart
    every = judge("GD701", _training_with_eval(calls=20))
    assert every.verdict == Verdict.CANNOT_JUDGE and "every one of the 20 calls" in every.reason
    # a record with more calls in eval mode than calls (an older gpudoctor counted a reloaded model's calls
    # apart) says so, and claims nothing about "every one of the 10 calls"
    odd = judge("GD701", _training_with_eval(calls=10, eval_calls=19, eval_with_grad=0))
    assert odd.verdict == Verdict.CANNOT_JUDGE and "every one" not in odd.reason
    assert "19 calls in eval mode but 10 calls in all" in odd.reason


def test_gd701_an_inference_run_points_at_its_first_call_with_grad():
    root = RootModuleUse("ResNet", calls=30, calls_with_grad=30, first_grad_call_site=EVAL_SITE)
    data = run(manifest=manifest(step_source="module", root_module=root), settings=settings(optimizers=()))
    (f,) = judge("GD701", data).findings
    assert (f.location.file, f.location.line) == ("train.py", 88) and "train.py:88" in f.fix.instruction


def test_gd701_cannot_judge_unknown_grad_mode():
    data = run(manifest=cpu_manifest(step_source="dataloader"), settings=settings(optimizers=()), metrics=(cpu_trace(),))
    assert judge("GD701", data).verdict == Verdict.CANNOT_JUDGE


# ---------------------------------------------------------------- GD702 loss-on-cpu


def test_gd702_fires_when_outputs_come_back_for_the_loss():
    m = trace(host_loss_ops=(NameStat("aten::cross_entropy_loss", 5, 2 * MS),),
              transfers=(transfer("DtoH", "pageable", count=5, nbytes=5 * 400_000, dur_ns=MS, steps_with=5),))
    (f,) = judge("GD702", run(metrics=(m,))).findings
    assert "aten::cross_entropy_loss" in f.message and "390.6 KiB per step" in f.message
    assert f.gain.share_pct == 6.0


def test_gd702_quiet_when_only_a_scalar_comes_back():
    m = trace(host_loss_ops=(NameStat("aten::mse_loss", 5, MS),),
              transfers=(transfer("DtoH", "pageable", count=5, nbytes=20, dur_ns=10_000, steps_with=5),))
    assert judge("GD702", run(metrics=(m,))).verdict == Verdict.FINE


def test_gd702_quiet_when_the_loss_runs_on_the_gpu():
    from gpudoctor.model import CpuSummary, Window, WindowKind

    w = Window(WindowKind.STEPS, 0, 50 * MS)
    m = trace(cpu=CpuSummary(w, 0, 0.0, 10 * MS, 20.0, 0, None), loss_ops=5)
    res = judge("GD702", run(metrics=(m,)))
    assert res.verdict == Verdict.FINE and res.applied  # the trace shows the loss on the GPU: "applied"
    # no loss op at all: nothing to see (a custom loss), or nothing to judge (inference)
    res = judge("GD702", run(metrics=(trace(cpu=m.cpu, loss_ops=0, backward_ops=3),)))
    assert res.verdict == Verdict.CANNOT_JUDGE and "custom loss" in res.reason
    res = judge("GD702", run(metrics=(trace(cpu=m.cpu, loss_ops=0, backward_ops=0, optimizer_steps=0),)))
    assert res.verdict == Verdict.NOT_APPLICABLE

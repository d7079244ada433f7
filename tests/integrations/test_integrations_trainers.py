"""Trainer callbacks (issue 43, item 2): ``GpuDoctorCallback`` for the Hugging Face ``Trainer`` and for Lightning,
on real packages (the `test` extra installs both; each test skips, saying so, without them), tiny random models
on the CPU: 40 optimizer steps with gradient accumulation 4 are 40 steps of 4 micro-batches; a collator that
sleeps per batch with no workers is named as the DataLoader finding's place; with workers that keep up, no
DataLoader finding.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
STEPS, ACCUMULATION = 40, 4

COMMON = """
import json, sys, time
import torch

def slow_collate(rows):  # the planted cost: 10 ms per batch, in the training process without workers
    time.sleep(0.01)
    return {"x": torch.stack([r["x"] for r in rows]), "labels": torch.stack([r["labels"] for r in rows])}

workers = int(sys.argv[1])
own_work_s = float(sys.argv[2]) / 1000  # the step's own work per micro-batch (a sleep: a device's kernels)
if workers:  # a batch's tensors cross from a worker in shared files: passing their descriptors took ~1.7 ms a
    torch.multiprocessing.set_sharing_strategy("file_system")  # batch on a 2-core VM, beyond GD201's hand-over
data = [{"x": torch.randn(8), "labels": torch.tensor(i % 2)} for i in range(4096)]
"""

HF = COMMON + f"""
from transformers import Trainer, TrainingArguments
from gpudoctor.integrations.transformers import GpuDoctorCallback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        time.sleep(own_work_s)
        logits = self.net(x)
        return {{"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}}

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    args = TrainingArguments(output_dir="hf-out", max_steps={STEPS}, per_device_train_batch_size=4,
                             gradient_accumulation_steps={ACCUMULATION}, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", dataloader_num_workers=workers,
                             disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=data, data_collator=slow_collate, callbacks=[cb]).train()
    print(json.dumps({{"run_dir": str(cb.session.run_dir), "report": cb.session.report.to_dict()}}))
"""

LIGHTNING = COMMON + f"""
import lightning as L
from torch.utils.data import DataLoader
from gpudoctor.integrations.lightning import GpuDoctorCallback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        time.sleep(own_work_s)
        return torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["labels"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    loader = DataLoader(data, batch_size=4, collate_fn=slow_collate, num_workers=workers,
                        persistent_workers=workers > 0)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps={STEPS}, accumulate_grad_batches={ACCUMULATION},
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb])
    trainer.fit(Tiny(), loader)
    print(json.dumps({{"run_dir": str(cb.session.run_dir), "report": cb.session.report.to_dict()}}))
"""

CASES = {"hf-trainer": ("transformers+accelerate", HF), "lightning": ("lightning", LIGHTNING)}


def _train(tmp_path: Path, case: str, workers: int, own_work_ms: float = 0.0) -> tuple[Path, dict]:
    packages, source = CASES[case]
    for package in packages.split("+"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (`pip install -e .[test]` installs it)")
    (tmp_path / "train.py").write_text(textwrap.dedent(source), encoding="utf-8")
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "train.py", str(workers), str(own_work_ms)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "gpudoctor:" in proc.stderr  # the summary, through the trainer's logger
    return tmp_path / out["run_dir"], out["report"]


def _collate_line(tmp_path: Path) -> int:
    lines = (tmp_path / "train.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.startswith("def slow_collate"))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_callback_records_the_trainer_s_steps_and_names_the_collator(tmp_path, case):
    run_dir, report = _train(tmp_path, case, workers=0)
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["steps_seen"] == STEPS and m["status"] == "completed", (m["steps_seen"], m["status"])
    assert "Session.step() ends each step" in m["step_source_reason"]
    assert f"gradient accumulation: {ACCUMULATION} micro-batches" in m["step_source_reason"]
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert len(rows) == STEPS and all(r["micro_batches"] == ACCUMULATION for r in rows), [r["micro_batches"] for r in rows]
    settings = json.loads((run_dir / "settings.json").read_text())
    (loader,) = settings["dataloaders"]
    site = loader["call_site"]
    assert loader["num_workers"] == 0 and Path(site["file"]).name == "train.py"
    assert site["line"] == _collate_line(tmp_path) and site["function"] == "slow_collate"
    # the loop waits ~10 ms per batch of a ~1 ms step: GD201 fires, on a busy machine too (beside GD205), at the
    # collator (the report's location is an object: file, line, col, function)
    gd201 = {f["code"]: f for f in report["findings"]}["GD201"]
    loc = gd201["location"]
    assert gd201["severity"] == "error" and loc is not None, gd201
    assert Path(loc["file"]).name == "train.py" and loc["line"] == site["line"], loc


@pytest.mark.parametrize("case", sorted(CASES))
def test_with_workers_there_is_no_dataloader_finding(tmp_path, case):
    # 2 workers sleeping 10 ms a batch deliver one per ~5 ms: the step's own 20 ms of work per micro-batch hides
    # them (with none, a ~0.5 ms step waits ~4.5 ms a batch for them, and GD201 rightly asks for more workers)
    run_dir, report = _train(tmp_path, case, workers=2, own_work_ms=20.0)
    assert not {f["code"] for f in report["findings"]} & {"GD201", "GD202", "GD203"}, report["findings"]
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["steps_seen"] == STEPS


SETTINGS_COMMON = """
import json, sys
import torch

data = [{"x": torch.randn(8), "labels": torch.tensor(i % 2)} for i in range(256)]
"""

HF_SETTINGS = SETTINGS_COMMON + """
from transformers import Trainer, TrainingArguments
from gpudoctor.integrations.transformers import GpuDoctorCallback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    args = TrainingArguments(output_dir="hf-out", max_steps=6, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, bf16=True, torch_compile=True,
                             torch_compile_backend="aot_eager", use_cpu=True, report_to=[], save_strategy="no",
                             logging_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb])
    trainer.train()  # the line the settings name
    print(json.dumps({"run_dir": str(cb.session.run_dir)}))
"""

LIGHTNING_SETTINGS = SETTINGS_COMMON + """
import lightning as L
from torch.utils.data import DataLoader
from gpudoctor.integrations.lightning import GpuDoctorCallback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self(batch["x"]), batch["labels"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=6, accumulate_grad_batches=2, precision="bf16-mixed",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[cb])
    model = torch.compile(Tiny(), backend="aot_eager")
    trainer.fit(model, DataLoader(data, batch_size=4))  # the line the settings name
    print(json.dumps({"run_dir": str(cb.session.run_dir)}))
"""

# what each trainer's arguments declare, recorded as `profile` records the same settings from torch's calls
DECLARED = {
    "hf-trainer": ("transformers+accelerate", HF_SETTINGS, "transformers.TrainingArguments",
                   {"bf16": True, "fp16": False, "gradient_accumulation_steps": 2, "torch_compile": True,
                    "torch_compile_backend": "aot_eager"}),
    "lightning": ("lightning", LIGHTNING_SETTINGS, "lightning.Trainer",
                  {"precision": "bf16-mixed", "accumulate_grad_batches": 2, "compiled": "dynamo"}),
}


@pytest.mark.parametrize("case", sorted(DECLARED))
def test_the_trainer_s_arguments_are_recorded_in_the_settings(tmp_path, case):
    """Precision, accumulation, torch.compile and the device, from the trainer's arguments: in the settings'
    fields the rules read (autocast for GD401, the torch.compile wrapper and what Dynamo compiled for the
    compile rules, device_type), at the user's call into the trainer; the arguments themselves among the flags."""
    packages, source, owner, arguments = DECLARED[case]
    for package in packages.split("+"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (`pip install -e .[test]` installs it)")
    (tmp_path / "train.py").write_text(textwrap.dedent(source), encoding="utf-8")
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / json.loads(proc.stdout.strip().splitlines()[-1])["run_dir"]
    settings = json.loads((run_dir / "settings.json").read_text())
    line = next(i for i, text in enumerate((tmp_path / "train.py").read_text().splitlines(), 1)
                if "the line the settings name" in text)
    flags = {f["name"]: f for f in settings["flags"]}
    for key, value in arguments.items():
        flag = flags[f"{owner}.{key}"]
        assert flag["value"] == value, flag
        assert flag["call_site"]["file"] == "train.py" and flag["call_site"]["line"] == line, flag
    assert settings["device_type"] == "cpu"
    mixed = [a for a in settings["autocast"] if a["call_site"] and a["call_site"]["line"] == line]
    assert [(a["device_type"], a["dtype"], a["enabled"]) for a in mixed] == [("cpu", "torch.bfloat16", True)], \
        settings["autocast"]
    assert settings["grad_scalers"] == []  # bf16 scales no loss
    (compiled,) = [w for w in settings["wrappers"] if w["kind"] == "torch.compile"]
    assert compiled["module"] == "Tiny" and compiled["call_site"]["line"] == line, compiled
    assert compiled["options"]["backend"] == "aot_eager", compiled
    assert settings["compile"] is not None and settings["compile"]["events"], settings["compile"]  # Dynamo's work
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["steps_seen"] == 6 and "gradient accumulation: 2 micro-batches" in m["step_source_reason"], m


TORCHRUN_HF = SETTINGS_COMMON + """
import os, time
from transformers import Trainer, TrainingArguments
from gpudoctor.integrations.transformers import GpuDoctorCallback

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        time.sleep(0.025)  # a second in all: the sampler's ticks see both ranks
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    args = TrainingArguments(output_dir="hf-out", max_steps=40, per_device_train_batch_size=4, use_cpu=True,
                             ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
                             disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[cb]).train()
    print(json.dumps({"rank": int(os.environ["RANK"]), "run_dir": str(cb.session.run_dir)}))
"""

TORCHRUN = SETTINGS_COMMON + """
import os, time
import lightning as L
from torch.utils.data import DataLoader
from gpudoctor.integrations.lightning import GpuDoctorCallback

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        time.sleep(0.025)  # a second in all: the sampler's ticks see both ranks
        return torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["labels"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

if __name__ == "__main__":
    cb = GpuDoctorCallback(out="runs")
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=40, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[cb])
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    print(json.dumps({"rank": int(os.environ["RANK"]), "run_dir": str(cb.session.run_dir)}))
"""


# how each job is launched: torchrun itself, or `accelerate launch` (its multi-process launcher, torchrun's
# agent in its own process; --multi_gpu on a machine without a GPU runs CPU ranks with gloo)
LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "train.py"],
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                   "--mixed_precision", "no", "--dynamo_backend", "no", "train.py"],
}


@pytest.mark.parametrize(("case", "launcher"), [("hf-trainer", "torchrun"), ("lightning", "torchrun"),
                                                ("hf-trainer", "accelerate")])
def test_torchrun_ranks_write_one_job_directory(tmp_path, case, launcher):
    """`torchrun --nproc_per_node 2` (gloo, CPU) of a HF Trainer / Lightning DDP fit, and `accelerate launch` of
    the HF Trainer, with the callback on every rank: one run directory in `profile --nproc-per-node`'s layout (each rank's files tagged by its rank, one
    manifest for the job with every rank's end), no crash, and `gpudoctor analyze` reads it as one job with both
    ranks' steps."""
    packages, _ = CASES[case]
    for package in packages.split("+"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (`pip install -e .[test]` installs it)")
    source = TORCHRUN_HF if case == "hf-trainer" else TORCHRUN
    (tmp_path / "train.py").write_text(textwrap.dedent(source), encoding="utf-8")
    env = os.environ.copy()
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run([sys.executable, *LAUNCHERS[launcher]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{\"rank\"")]
    assert sorted(p["rank"] for p in printed) == [0, 1], proc.stdout
    assert len({p["run_dir"] for p in printed}) == 1, printed  # one directory for the job
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir()]  # and nothing else: no second directory, no job file
    names = {p.name for p in run_dir.iterdir()}
    for rank in (0, 1):
        assert {f"steps.rank{rank}.jsonl", f"settings.rank{rank}.json"} <= names, names
        rows = [json.loads(line) for line in (run_dir / f"steps.rank{rank}.jsonl").read_text().splitlines()]
        assert len(rows) == 40, (rank, len(rows))
    assert "steps.jsonl" not in names and "manifest.json" in names and "samples.jsonl" in names
    assert not any(n.startswith(".child-state") for n in names), names  # merged into the manifest
    m = json.loads((run_dir / "manifest.json").read_text())
    assert (m["launcher"], m["world_size"], m["rank"], m["status"]) == ("torchrun", 2, None, "completed"), m
    assert sorted((e["rank"], e["status"], e["steps_seen"]) for e in m["rank_ends"]) == [(0, "completed", 40),
                                                                                         (1, "completed", 40)]
    assert all(e["traces"] for e in m["rank_ends"]) and set(m["traces"]) <= names, (m["traces"], names)
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert {s.get("rank") for s in samples if s.get("role") == "main"} == {0, 1}  # both ranks sampled
    analyzed = subprocess.run([sys.executable, "-c", "import gpudoctor, json, sys; "
                               "from gpudoctor.pipeline import analyze_paths; "
                               "report = gpudoctor.load(sys.argv[1]); "
                               "print(json.dumps([sorted({s.rank for s in analyze_paths([sys.argv[1]]).steps}), "
                               "report.to_dict()['source']]))", str(run_dir)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    ranks, source = json.loads(analyzed.stdout.strip().splitlines()[-1])
    assert ranks == [0, 1] and Path(source).name == run_dir.name  # one job, both ranks' steps

"""`gpudoctor profile` on a framework's own loop (issue 28, item 6): Lightning's ``Trainer.fit`` and the
Hugging Face ``Trainer.train``, tiny and on the CPU, find their training steps (the optimizer step hook).

Neither framework is a dependency of gpudoctor; the `test` extra installs them (CPU wheels, ~30 s on
top of torch) and the two runs take ~13 s. Each test skips, saying so, where its packages are not
installed.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
from collect_testlib import manifest, only_run_dir, run_profile, steps

pytestmark = pytest.mark.slow

STEPS = 6

LIGHTNING_FIT = f"""
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps={STEPS}, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
"""

HF_TRAIN = f"""
import torch
from transformers import Trainer, TrainingArguments


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {{"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}}


if __name__ == "__main__":
    data = [{{"x": torch.randn(8), "labels": torch.tensor(i % 2)}} for i in range(64)]
    args = TrainingArguments(output_dir="hf-out", max_steps={STEPS}, per_device_train_batch_size=4,
                             use_cpu=True, report_to=[], save_strategy="no", logging_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=data).train()
"""


def _needs(packages: str) -> None:
    for package in packages.split("+"):
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (not a gpudoctor dependency; `pip install -e .[test]` "
                        "installs it)")


@pytest.mark.parametrize(
    ("package", "source"),
    [("lightning", LIGHTNING_FIT), ("transformers+accelerate", HF_TRAIN)],  # HF's Trainer needs accelerate
    ids=["lightning-fit", "hf-trainer-train"],
)
def test_profile_finds_the_steps_of_a_framework_loop(tmp_path, package, source):
    _needs(package)
    (tmp_path / "train.py").write_text(textwrap.dedent(source), encoding="utf-8")
    proc = run_profile("--no-report", "--out", "runs", "train.py", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = only_run_dir(tmp_path / "runs")
    m = manifest(run_dir)
    assert m["step_source"] == "optimizer", m["step_source"]  # the framework's optimizer.step(), hooked
    assert m["steps_seen"] == STEPS
    assert len(steps(run_dir)) == STEPS

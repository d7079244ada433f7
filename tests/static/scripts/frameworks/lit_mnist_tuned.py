"""The same LightningModule, tuned: workers, pinned batches, bf16, tensors logged as tensors."""

import os

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, random_split
from torchvision import datasets, transforms

WORKERS = max(1, len(os.sched_getaffinity(0)) - 1)


class LitClassifier(L.LightningModule):
    def __init__(self, hidden: int = 256, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = nn.Sequential(
            nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if batch_idx % 500 == 0 and torch.isnan(loss):
            self.print(f"NaN loss at step {self.global_step}")
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", (logits.argmax(dim=1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, fused=True)

    def setup(self, stage=None):
        full = datasets.MNIST("data", train=True, download=True, transform=transforms.ToTensor())
        self.train_set, self.val_set = random_split(full, [55000, 5000])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=256, shuffle=True, num_workers=WORKERS,
                          pin_memory=True, persistent_workers=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=512, num_workers=WORKERS, pin_memory=True,
                          persistent_workers=True)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=5,
                        accumulate_grad_batches=2)
    trainer.fit(LitClassifier())

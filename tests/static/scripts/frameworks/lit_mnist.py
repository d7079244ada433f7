"""An MNIST classifier as a LightningModule, the way Lightning's tutorials write one."""

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, random_split
from torchvision import datasets, transforms


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
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("train_loss", loss.item())
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("val_acc", acc, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, fused=True)

    def setup(self, stage=None):
        full = datasets.MNIST("data", train=True, download=True, transform=transforms.ToTensor())
        self.train_set, self.val_set = random_split(full, [55000, 5000])

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=64, shuffle=True, pin_memory=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256, num_workers=4, pin_memory=True, persistent_workers=True)


if __name__ == "__main__":
    trainer = L.Trainer(accelerator="gpu", devices=1, precision=32, max_epochs=5)
    trainer.fit(LitClassifier())

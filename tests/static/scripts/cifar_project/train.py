"""Train a ResNet-ish CNN on CIFAR-10: the entry point (argparse, epochs, checkpoints)."""

from __future__ import annotations

import argparse
import os
import time

import torch
from data import build_loaders
from engine import evaluate, train_one_epoch
from models import SmallResNet
from torch import nn


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CIFAR-10 training")
    parser.add_argument("--data", default=os.path.expanduser("~/data/cifar10"))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("-b", "--batch-size", type=int, default=128)
    parser.add_argument("-j", "--workers", type=int, default=0, help="data loading workers")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--amp", action="store_true", help="mixed precision")
    parser.add_argument("--log-every", type=int, default=50)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader, val_loader = build_loaders(args.data, args.batch_size, args.workers)
    model = SmallResNet(num_classes=10).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)
    best = 0.0
    for epoch in range(args.epochs):
        start = time.time()
        train_loss = train_one_epoch(model, train_loader, criterion, optimizer, device, args)
        acc = evaluate(model, val_loader, device)
        scheduler.step()
        print(f"epoch {epoch}: loss {train_loss:.3f} acc {acc:.3f} ({time.time() - start:.0f} s)")
        if acc > best:
            best = acc
            torch.save(model.state_dict(), "best.pt")


if __name__ == "__main__":
    main()

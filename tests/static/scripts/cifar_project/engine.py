"""One training epoch and the evaluation pass."""

from __future__ import annotations

import torch


def train_one_epoch(model, loader, criterion, optimizer, device, args) -> float:
    model.train()
    running_loss = 0.0
    for step, (images, targets) in enumerate(loader):
        images = images.to(device)
        targets = targets.to(device)
        with torch.autocast(device_type="cuda", enabled=args.amp):
            outputs = model(images)
            loss = criterion(outputs, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
        if step % args.log_every == 0:
            print(f"  step {step}: loss {loss.item():.4f}")
    return running_loss / len(loader)


def evaluate(model, loader, device) -> float:
    model.eval()
    correct = total = 0
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        outputs = model(images)
        correct += (outputs.argmax(dim=1) == targets).sum().item()
        total += targets.numel()
    return correct / total

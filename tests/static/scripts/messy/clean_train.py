"""A tuned training script: nothing for `gpudoctor check` to report."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--log-every", type=int, default=100)
    return p.parse_args()


@torch.inference_mode()
def evaluate(model, loader, device):
    model.eval()
    correct = torch.zeros((), device=device)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            correct += (model(images).argmax(1) == labels).sum()
    return correct.item() / len(loader.dataset)


def main():
    args = parse_args()
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    train_set = datasets.ImageFolder("data/train", tf)
    val_set = datasets.ImageFolder("data/val", tf)
    common = dict(num_workers=args.workers, pin_memory=True, persistent_workers=True)
    train_loader = DataLoader(train_set, batch_size=256, shuffle=True, drop_last=True, **common)
    val_loader = DataLoader(val_set, batch_size=256, **common)
    model = models.resnet50().to(device, memory_format=torch.channels_last)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    for epoch in range(args.epochs):
        model.train()
        total = torch.zeros((), device=device)
        for step, (images, labels) in enumerate(train_loader):
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.detach()
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}")
        acc = evaluate(model, val_loader, device)
        print(f"epoch {epoch}: mean loss {total.item() / len(train_loader):.4f}, accuracy {acc:.3f}")


if __name__ == "__main__":
    main()

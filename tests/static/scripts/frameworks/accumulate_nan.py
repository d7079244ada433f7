"""ImageNet-style training with gradient accumulation and a NaN guard on every micro-batch."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

parser = argparse.ArgumentParser()
parser.add_argument("--data", default="data/imagenet")
parser.add_argument("--epochs", type=int, default=90)
parser.add_argument("--accum-steps", type=int, default=8)
parser.add_argument("--workers", type=int, default=8)
args = parser.parse_args()

device = torch.device("cuda")
tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
train_set = datasets.ImageFolder(f"{args.data}/train", tf)
val_set = datasets.ImageFolder(f"{args.data}/val", tf)
train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=args.workers, pin_memory=True,
                          persistent_workers=True)
val_loader = DataLoader(val_set, batch_size=128, num_workers=args.workers, pin_memory=True, persistent_workers=True)
model = models.resnet50().to(device, memory_format=torch.channels_last)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
torch.backends.cudnn.benchmark = True

for epoch in range(args.epochs):
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for i, (images, labels) in enumerate(train_loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(images), labels) / args.accum_steps
        if torch.isnan(loss):
            print(f"NaN loss at epoch {epoch} batch {i}, skipping")
            continue
        if loss > 10:
            print("loss exploded, clipping harder")
        loss.backward()
        if (i + 1) % args.accum_steps == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    model.eval()
    correct = torch.zeros((), device=device)
    for images, labels in val_loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            correct += (model(images).argmax(1) == labels).sum()
    print(f"epoch {epoch}: val accuracy {correct.item() / len(val_set):.4f}")

"""The same accelerate loop with mixed precision asked of the Accelerator."""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def main():
    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=4)
    tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])
    train_set = datasets.ImageFolder("data/train", tf)
    val_set = datasets.ImageFolder("data/val", tf)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=8, pin_memory=True,
                              persistent_workers=True)
    val_loader = DataLoader(val_set, batch_size=128, num_workers=8, pin_memory=True, persistent_workers=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 224 * 224, 512), nn.ReLU(), nn.Linear(512, 1000))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    model, optimizer, train_loader, val_loader = accelerator.prepare(model, optimizer, train_loader, val_loader)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(10):
        model.train()
        for images, labels in train_loader:
            with accelerator.accumulate(model):
                loss = criterion(model(images), labels)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()

        model.eval()
        correct = 0
        for images, labels in val_loader:
            with torch.no_grad():
                preds = model(images).argmax(dim=1)
            correct += accelerator.gather(preds == labels).sum()
        accelerator.print(f"epoch {epoch}: {correct.item()} correct")


if __name__ == "__main__":
    main()

"""A CIFAR-style convnet (pytorch/examples' imagenet main.py, shrunk): cudnn.benchmark never set."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dataset = TensorDataset(torch.randn(256, 3, 32, 32), torch.randint(0, 10, (256,)))
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, pin_memory=True,
                        persistent_workers=True)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 32 * 32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    criterion = nn.CrossEntropyLoss()
    for images, target in loader:
        images = images.to(device, non_blocking=True)
        target = target.to(device, non_blocking=True)
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()

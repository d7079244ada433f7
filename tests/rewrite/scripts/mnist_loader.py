"""MNIST the way pytorch/examples trains it: the DataLoader built in main(), no workers, no pinning."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


class Digits(Dataset):
    """Stands for torchvision's MNIST: one image decoded and normalized per item."""

    def __len__(self):
        return 512

    def __getitem__(self, i):
        image = torch.randn(1, 28, 28)
        return (image - 0.1307) / 0.3081, torch.tensor(i % 10)


def collate(batch):  # the script's own collate_fn: a fix must keep it
    xs, ys = zip(*batch, strict=True)
    return torch.stack(xs), torch.stack(ys)


def train(model, device, loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % 10 == 0:
            print(f"epoch {epoch} [{batch_idx}] loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser(description="PyTorch MNIST Example")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    dataset = Digits()
    train_loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,  # keep: reshuffled every epoch
        collate_fn=collate,
    )
    model = Net().to(device)
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for epoch in range(1, args.epochs + 1):
        train(model, device, train_loader, optimizer, epoch)


if __name__ == "__main__":
    main()

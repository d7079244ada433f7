"""Datasets and loaders."""

from __future__ import annotations

from torch.utils.data import DataLoader
from torchvision import datasets, transforms

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)


def build_loaders(root: str, batch_size: int, workers: int):
    train_tf = transforms.Compose(
        [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
         transforms.Normalize(MEAN, STD)]
    )
    test_tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    train_set = datasets.CIFAR10(root, train=True, download=True, transform=train_tf)
    val_set = datasets.CIFAR10(root, train=False, download=True, transform=test_tf)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=workers, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=256, shuffle=False, num_workers=workers)
    return train_loader, val_loader

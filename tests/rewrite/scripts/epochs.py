"""Worker processes started again every epoch (pytorch/examples' imagenet loop over epochs)."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Crops(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.randn(3, 32, 32).clamp_(-1, 1), i % 10


def main(epochs=3):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(Crops(), 64, True, num_workers=2, pin_memory=True)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    for _epoch in range(epochs):
        for images, target in loader:
            images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()

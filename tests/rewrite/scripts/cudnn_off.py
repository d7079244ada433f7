"""pytorch/examples' imagenet main.py sets cudnn flags at start-up; this one turned the autotuner off."""

import torch
import torch.backends.cudnn as cudnn
import torch.nn as nn


def main():
    cudnn.benchmark = False  # was True in the example this came from
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Conv2d(3, 8, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    for _ in range(10):
        x = torch.randn(8, 3, 32, 32, device=device)
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()

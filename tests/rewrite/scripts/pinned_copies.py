"""Pinned batches copied with blocking .to() and .cuda() calls (the word_language_model style)."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = torch.device("cuda")
    dataset = TensorDataset(torch.randn(1024, 32), torch.randint(0, 2, (1024,)))
    loader = DataLoader(dataset, batch_size=128, shuffle=True, num_workers=2, pin_memory=True,
                        persistent_workers=True)
    model = nn.Linear(32, 2).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    for x, y in loader:
        x = x.to(device)  # the input
        y = y.cuda()
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()

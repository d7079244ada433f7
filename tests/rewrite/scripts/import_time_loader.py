"""A notebook exported as a script: the DataLoader is built at import time, with no main guard."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Rows(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        return torch.randn(16).tanh(), i % 2


loader = DataLoader(Rows(), batch_size=32, shuffle=True)
model = nn.Linear(16, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

# Pinned batches, but each copy blocks the host until it is done.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=True)

for x, y in loader:
    x = x.to(device)
    y = y.to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

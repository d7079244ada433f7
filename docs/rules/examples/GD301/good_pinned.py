# Workers hand over batches in page-locked memory; the copies run asynchronously.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=True)

for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

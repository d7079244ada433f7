# Batches come from pageable memory and are copied to the GPU every step.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=256, num_workers=4, pin_memory=False)

for x, y in loader:
    x, y = x.to(device), y.to(device)
    loss = criterion(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

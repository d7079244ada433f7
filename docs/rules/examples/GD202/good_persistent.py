# The workers survive from one epoch to the next.
import torch
from torch.utils.data import DataLoader

train_loader = DataLoader(dataset, batch_size=128, num_workers=4, pin_memory=True,
                          persistent_workers=True)

for epoch in range(90):
    for x, y in train_loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

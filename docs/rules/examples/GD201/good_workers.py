# Batches are loaded by four worker processes while the GPU trains.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda")
loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                    persistent_workers=True, pin_memory=True)

for images, labels in loader:
    images = images.to(device, non_blocking=True)
    labels = labels.to(device, non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

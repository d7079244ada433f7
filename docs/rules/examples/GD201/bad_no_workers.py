# The DataLoader reads and collates every batch in the training process.
import torch
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
loader = DataLoader(dataset, batch_size=64, shuffle=True)  # num_workers defaults to 0

for images, labels in loader:
    images = images.to(device)
    labels = labels.to(device)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

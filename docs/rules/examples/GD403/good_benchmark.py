# cuDNN times the candidate algorithms once and keeps the fastest.
import torch
from torch import nn

torch.backends.cudnn.benchmark = True

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
for images, labels in loader:
    images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

# A convolutional network on fixed-size images, cudnn.benchmark never set.
import torch
from torch import nn

model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
for images, labels in loader:
    images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
    loss = criterion(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

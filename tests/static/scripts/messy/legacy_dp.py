"""An older multi-GPU script: DataParallel, torch.cuda.amp, a cache flush and prints every step."""

import numpy as np
import torch
import torch.nn as nn
import torchvision
from torch.cuda.amp import GradScaler, autocast
from torch.utils.data import DataLoader
from torchvision import models

NUM_WORKERS = 8

model = models.resnet50(num_classes=100)
model = nn.DataParallel(model).cuda()
criterion = nn.CrossEntropyLoss().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
scaler = GradScaler()
train_set = torchvision.datasets.ImageFolder("data/train", transform=torchvision.transforms.ToTensor())
loader = DataLoader(train_set, batch_size=512, shuffle=True, num_workers=NUM_WORKERS, pin_memory=True)

torch.backends.cudnn.benchmark = True
for epoch in range(100):
    accs = []
    for images, target in loader:
        images = images.cuda()
        target = target.cuda()
        with autocast():
            output = model(images)
            loss = criterion(output, target)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        pred = output.data.cpu().numpy()
        accs.append(np.mean(pred.argmax(1) == target.cpu().numpy()))
        print("loss", loss)
        torch.cuda.empty_cache()
    print("epoch", epoch, np.mean(accs))

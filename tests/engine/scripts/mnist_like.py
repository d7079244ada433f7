"""pytorch/examples' mnist on the CPU without torchvision (the test of GD201's loader hot functions): its model,
a map-style dataset whose transforms are a ToTensor, a Python augmentation of AUG iterations per image and an
nn.Module Normalize (as torchvision's), num_workers=0."""

import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

AUG = int(os.environ.get("AUG", "0"))  # Python work per image in the loading


class Normalize(nn.Module):  # as torchvision.transforms.Normalize: an nn.Module
    def __init__(self, mean, std):
        super().__init__()
        self.mean, self.std = mean, std

    def forward(self, t):  # SITE:normalize
        return (t - self.mean) / self.std


def to_tensor(img):
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).unsqueeze(0)


def jitter(t):
    total = 0
    for i in range(AUG):
        total += i * i
    return t + (total % 3) * 1e-6


class Compose:
    def __init__(self, ts):
        self.ts = ts

    def __call__(self, x):
        for t in self.ts:
            x = t(x)
        return x


class FakeMNIST(Dataset):
    def __init__(self, n):
        rng = np.random.default_rng(0)
        self.data = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        self.targets = rng.integers(0, 10, size=n)
        self.transform = Compose([to_tensor, jitter, Normalize(0.1307, 0.3081)])

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.transform(self.data[i]), int(self.targets[i])


class Net(nn.Module):  # pytorch/examples' mnist model
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):  # SITE:model_forward
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


torch.manual_seed(1)
loader = DataLoader(FakeMNIST(4096), batch_size=32, shuffle=True)
model = Net()
opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
model.train()
for data, target in loader:
    opt.zero_grad()
    F.nll_loss(model(data), target).backward()
    opt.step()

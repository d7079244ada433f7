"""A dcgan-style script (pytorch/examples dcgan/main.py, cut down to run on a CPU in a second): the
DataLoader takes its workers from `--workers` through `int(opt.workers)`, and `--workers 0` is valid."""

import argparse

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data

parser = argparse.ArgumentParser()
parser.add_argument('--workers', type=int, help='number of data loading workers', default=2)
parser.add_argument('--batchSize', type=int, default=4, help='input batch size')
parser.add_argument('--niter', type=int, default=2, help='number of epochs to train for')
parser.add_argument('--accel', action='store_true', default=False, help='enables accelerator')
opt = parser.parse_args()

if opt.accel and torch.accelerator.is_available():
    device = torch.accelerator.current_accelerator()
else:
    device = torch.device("cpu")

dataset = torch.utils.data.TensorDataset(torch.randn(16, 8), torch.randint(0, 2, (16,)))
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize,
                                         shuffle=True, num_workers=int(opt.workers))

netD = nn.Linear(8, 2).to(device)
criterion = nn.CrossEntropyLoss()
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))

for epoch in range(opt.niter):
    for x, y in dataloader:
        netD.zero_grad()
        errD = criterion(netD(x.to(device)), y.to(device))
        errD.backward()
        optimizerD.step()
    print(f"[{epoch}/{opt.niter}] Loss_D: {errD.item():.4f}")

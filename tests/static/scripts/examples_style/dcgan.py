"""A DCGAN written the way the PyTorch examples write one: more than one GPU only when --ngpu asks."""

import argparse

import torch
import torch.nn as nn
import torch.optim as optim
import torch.utils.data
import torchvision.datasets as dset
import torchvision.transforms as transforms

parser = argparse.ArgumentParser()
parser.add_argument("--dataroot", default="data", help="path to dataset")
parser.add_argument("--workers", type=int, default=2, help="number of data loading workers")
parser.add_argument("--batchSize", type=int, default=64, help="input batch size")
parser.add_argument("--nz", type=int, default=100, help="size of the latent z vector")
parser.add_argument("--niter", type=int, default=25, help="number of epochs to train for")
parser.add_argument("--ngpu", type=int, default=1, help="number of GPUs to use")
opt = parser.parse_args()

dataset = dset.CIFAR10(root=opt.dataroot, download=True,
                       transform=transforms.Compose([transforms.Resize(64), transforms.ToTensor()]))
dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize, shuffle=True,
                                         num_workers=int(opt.workers), pin_memory=True)

ngpu = int(opt.ngpu)
nz = int(opt.nz)
device = torch.device("cuda:0" if (torch.cuda.is_available() and ngpu > 0) else "cpu")
torch.backends.cudnn.benchmark = True


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, 256, 4, 1, 0, bias=False),
            nn.BatchNorm2d(256),
            nn.ReLU(True),
            nn.ConvTranspose2d(256, 3, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(3, 64, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(64, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator(ngpu).to(device)
netD = Discriminator().to(device)
if device.type == "cuda" and ngpu > 1:
    netD = nn.DataParallel(netD, list(range(ngpu)))

criterion = nn.BCELoss()
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999), fused=True)
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999), fused=True)

for epoch in range(opt.niter):
    for i, data in enumerate(dataloader, 0):
        real = data[0].to(device, non_blocking=True)
        batch_size = real.size(0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            netD.zero_grad()
            errD_real = criterion(netD(real), torch.ones(batch_size, device=device))
            noise = torch.randn(batch_size, nz, 1, 1, device=device)
            fake = netG(noise)
            errD_fake = criterion(netD(fake.detach()), torch.zeros(batch_size, device=device))
        (errD_real + errD_fake).backward()
        optimizerD.step()

        netG.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            errG = criterion(netD(fake), torch.ones(batch_size, device=device))
        errG.backward()
        optimizerG.step()
        if i % 100 == 0:
            print(f"[{epoch}/{opt.niter}][{i}/{len(dataloader)}] Loss_D: {(errD_real + errD_fake).item():.4f} "
                  f"Loss_G: {errG.item():.4f}")

"""Two optimizers of a GAN (pytorch/examples' dcgan): one can take fused=True, one asks for foreach."""

import torch
import torch.nn as nn
import torch.optim as optim


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    netD = nn.Linear(16, 1).to(device)
    netG = nn.Linear(8, 16).to(device)
    optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999), foreach=True)
    for _ in range(10):
        fake = netG(torch.randn(4, 8, device=device))
        lossD = netD(fake.detach()).mean()
        optimizerD.zero_grad()
        lossD.backward()
        optimizerD.step()
        lossG = -netD(fake).mean()
        optimizerG.zero_grad()
        lossG.backward()
        optimizerG.step()


if __name__ == "__main__":
    main()

# One process drives every GPU through nn.DataParallel.
import torch
from torch import nn

model = nn.DataParallel(model).cuda()
for x, y in loader:
    loss = criterion(model(x), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

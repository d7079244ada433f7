# foreach=False forces the per-parameter loop: several kernels per tensor every step.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=False)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

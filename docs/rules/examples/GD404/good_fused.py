# The fused implementation updates every parameter in a few kernels.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

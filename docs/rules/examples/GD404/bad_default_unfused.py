# AdamW on CUDA without fused=True runs the (slower) default foreach implementation.
import torch

model = model.cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
for x, y in loader:
    loss = criterion(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

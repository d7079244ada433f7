# Mixed precision through the deprecated torch.cuda.amp namespace.
import torch

scaler = torch.cuda.amp.GradScaler()
for x, y in loader:
    x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
    with torch.cuda.amp.autocast():
        loss = criterion(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()

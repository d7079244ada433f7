# Predictions stay on the device; one copy at the end of the epoch.
import torch

device = torch.device("cuda")
all_preds = []
for x, y in loader:
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    logits = model(x)
    loss = criterion(logits, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    all_preds.append(logits.argmax(dim=1).detach())
predictions = torch.cat(all_preds).cpu().numpy()

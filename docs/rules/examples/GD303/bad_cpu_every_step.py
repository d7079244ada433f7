# Predictions are copied to the host in every training step.
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
    all_preds.append(logits.argmax(dim=1).cpu().numpy())

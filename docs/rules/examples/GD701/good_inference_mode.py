# Evaluation under inference_mode: no graph, no saved activations.
import torch


@torch.inference_mode()
def evaluate(model, loader, device):
    model.eval()
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum()
    return correct / len(loader.dataset)

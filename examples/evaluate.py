"""Evaluate a trained SmallNet checkpoint on a held-out synthetic set."""
import argparse

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from train import SmallNet


def evaluate(model, loader):
    model.eval()
    total_loss = 0.0
    correct = 0
    seen = 0
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
        logits = model(images)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(1) == labels).sum())
        seen += labels.numel()
    return total_loss / seen, correct / seen


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="/tmp/smallnet.pt")
    args = parser.parse_args()

    model = SmallNet().cuda()
    model.load_state_dict(torch.load(args.checkpoint, map_location="cuda"))
    data = TensorDataset(torch.randn(1024, 3, 32, 32), torch.randint(0, 10, (1024,)))
    loader = DataLoader(data, batch_size=256)
    loss, accuracy = evaluate(model, loader)
    print(f"eval loss {loss:.4f}, accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()

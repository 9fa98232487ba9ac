"""Fine-tune a pretrained classifier with mixed precision, then score the
held-out split and write the best checkpoint.

    python amp_finetune.py --data ./data --epochs 5 --max-grad-norm 1.0
"""
import argparse
import json
import pathlib

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=pathlib.Path, default=pathlib.Path("data"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("checkpoints"))
    return parser.parse_args()


class Classifier(nn.Module):
    def __init__(self, in_features=128, hidden=256, classes=10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.BatchNorm1d(hidden),
            nn.GELU(),
            nn.Dropout(0.1),
            nn.Linear(hidden, hidden),
            nn.GELU(),
        )
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def load_split(root, name):
    path = root / f"{name}.pt"
    if path.exists():
        features, labels = torch.load(path, map_location="cuda")
    else:  # synthetic data so the script runs anywhere
        features, labels = torch.randn(2048, 128), torch.randint(0, 10, (2048,))
    return TensorDataset(features, labels)


def train_one_epoch(model, loader, optimizer, scaler, criterion, max_grad_norm):
    model.train()
    running = torch.zeros((), device="cuda")
    for features, labels in loader:
        features = features.cuda(non_blocking=True)
        labels = labels.cuda(non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(features), labels)
        scaler.scale(loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        scaler.step(optimizer)
        scaler.update()
        running += loss.detach()
    return running / len(loader)


def evaluate(model, loader, criterion):
    model.eval()
    total_loss, correct, seen = 0.0, 0, 0
    for features, labels in loader:
        features, labels = features.cuda(), labels.cuda()
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(features)
            total_loss += criterion(logits, labels).float() * len(labels)
        correct += (logits.argmax(dim=1) == labels).sum()
        seen += len(labels)
    return (total_loss / seen).item(), (correct / seen).item()


def main():
    args = parse_args()
    device = torch.device(args.device)
    train_set, val_set = load_split(args.data, "train"), load_split(args.data, "val")
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=4, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=256, num_workers=4, pin_memory=True)

    model = Classifier().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.amp.GradScaler("cuda")
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)

    args.out.mkdir(parents=True, exist_ok=True)
    best = 0.0
    for epoch in range(args.epochs):
        train_loss = train_one_epoch(model, train_loader, optimizer, scaler, criterion, args.max_grad_norm)
        val_loss, val_acc = evaluate(model, val_loader, criterion)
        print(json.dumps({"epoch": epoch, "train_loss": train_loss.item(), "val_loss": val_loss, "val_acc": val_acc}))
        if val_acc > best:
            best = val_acc
            torch.save(model.state_dict(), args.out / "best.pt")


if __name__ == "__main__":
    main()

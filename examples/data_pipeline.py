"""Train a small image classifier from pre-extracted feature shards.

Shards are ``.pt`` files holding ``{"features": FloatTensor[N, D], "labels": LongTensor[N]}``.
Usage: python data_pipeline.py --shards data/shards --epochs 5
"""
import argparse
import glob
import os

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class ShardDataset(Dataset):
    def __init__(self, shard_dir):
        self.features = []
        self.labels = []
        for path in sorted(glob.glob(os.path.join(shard_dir, "*.pt"))):
            shard = torch.load(path)
            self.features.append(shard["features"])
            self.labels.append(shard["labels"])
        self.features = torch.cat(self.features)
        self.labels = torch.cat(self.labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"features": self.features[index], "labels": self.labels[index]}


class MLP(nn.Module):
    def __init__(self, in_dim, hidden, num_classes, dropout=0.1):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def make_loaders(args):
    dataset = ShardDataset(args.shards)
    val_size = max(1, len(dataset) // 10)
    train_set, val_set = torch.utils.data.random_split(dataset, [len(dataset) - val_size, val_size])
    loader_kwargs = {"batch_size": args.batch_size, "num_workers": args.workers, "pin_memory": True}
    train_loader = DataLoader(train_set, shuffle=True, drop_last=True, **loader_kwargs)
    val_loader = DataLoader(val_set, shuffle=False, **loader_kwargs)
    return train_loader, val_loader


def train_epoch(model, train_loader, optimizer, criterion, device, epoch, log_every):
    model.train()
    running = torch.zeros((), device=device)
    for step, batch in enumerate(train_loader):
        features = batch["features"].to(device)
        labels = batch["labels"].to(device)

        optimizer.zero_grad(set_to_none=False)
        logits = model(features)
        loss = criterion(logits, labels)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()

        running += loss.detach()
        if step % log_every == 0:
            print(f"epoch {epoch} step {step}: loss {running.item() / (step + 1):.4f}")
    return running.item() / len(train_loader)


@torch.no_grad()
def validate(model, val_loader, device):
    model.eval()
    correct = torch.zeros((), device=device, dtype=torch.long)
    seen = 0
    for batch in val_loader:
        features = batch["features"].cuda()
        labels = batch["labels"].to(device, non_blocking=True)
        correct += (model(features).argmax(dim=1) == labels).sum()
        seen += labels.numel()
    return correct.item() / seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", default="data/shards")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader, val_loader = make_loaders(args)
    sample = train_loader.dataset[0]["features"]
    model = MLP(sample.numel(), 512, 10).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        train_loss = train_epoch(model, train_loader, optimizer, criterion, device, epoch, args.log_every)
        accuracy = validate(model, val_loader, device)
        print(f"epoch {epoch}: train loss {train_loss:.4f}, val accuracy {accuracy:.3f}")
        torch.save(model.state_dict(), f"mlp_epoch{epoch}.pt")


if __name__ == "__main__":
    main()

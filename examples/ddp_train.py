"""Data-parallel training of a small text classifier with gradient accumulation.

Launch with `torchrun --nproc_per_node=N examples/ddp_train.py`. With one
process (no torchrun) it falls back to a single-GPU or CPU run.
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


class TextClassifier(nn.Module):
    def __init__(self, vocab_size: int = 5000, dim: int = 256, num_classes: int = 4) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, dim)
        self.encoder = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Dropout(0.2), nn.Linear(dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens):
        h = self.embedding(tokens)
        h = self.norm(h + self.encoder.forward(h))
        return self.head(h)


def synthetic_split(num_samples: int, seq_len: int = 64, vocab_size: int = 5000) -> TensorDataset:
    tokens = torch.randint(0, vocab_size, (num_samples, seq_len))
    labels = tokens[:, 0] % 4
    return TensorDataset(tokens, labels)


def setup_distributed():
    if "RANK" not in os.environ:
        return 0, 1
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size()


def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for tokens, labels in loader:
            tokens, labels = tokens.to(device), labels.to(device)
            correct += (model(tokens).argmax(-1) == labels).sum()
            total += labels.numel()
    return (correct / total).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--accum-steps", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    args = parser.parse_args()

    rank, world_size = setup_distributed()
    device = torch.device(f"cuda:{rank % torch.cuda.device_count()}" if torch.cuda.is_available() else "cpu")

    net = TextClassifier().to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None) if world_size > 1 else net
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    train_loader = DataLoader(synthetic_split(8192), batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(synthetic_split(1024), batch_size=256)

    model.train()
    for epoch in range(args.epochs):
        for step, (tokens, labels) in enumerate(train_loader):
            tokens, labels = tokens.to(device), labels.to(device)
            loss = F.cross_entropy(model(tokens), labels) / args.accum_steps
            loss.backward()
            if (step + 1) % args.accum_steps == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        accuracy = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: val accuracy {accuracy:.3f}")

    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

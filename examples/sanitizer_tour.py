"""A run that shows every picture the sanitizer draws.

    torchlint-sanitize --report-html tour.html --trace tour.json sanitizer_tour.py
    torchlint check --runtime-report tour-report.json sanitizer_tour.py

Three parts, each a small version of a real bug (``--part`` picks one):

- ``sync``: a training loop that reads its loss on the host every step (a
  ``.item()`` the linter flags as TL101), logs through a helper, and clips
  gradients with ``error_if_nonfinite=True``, whose host read sits inside
  torch where no linter looks;
- ``memory``: a loop that keeps some of each step's buffers alive, so the
  allocator keeps mapping new segments full of small holes, until a large
  request fails with memory free but fragmented (under a 1 GiB cap);
- ``race``: a side stream fills a buffer that the default stream reads
  without waiting for it.
"""
import argparse

import torch
import torch.nn as nn

MiB = 1 << 20
DEVICE = torch.device("cuda")


def log_metrics(step, loss):
    # Formats a GPU tensor: the host read is in this helper, called every step.
    print(f"step {step}: loss {loss:.4f}")


def sync_part(steps: int) -> None:
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).to(DEVICE)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    inputs = torch.randn(256, 512, device=DEVICE)
    targets = torch.randint(0, 10, (256,), device=DEVICE)
    total = 0.0
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, error_if_nonfinite=True)
        optimizer.step()
        total += loss.item()
        log_metrics(step, loss)
    print(f"mean loss {total / steps:.4f}")


def memory_part(steps: int) -> None:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    device = torch.cuda.current_device()
    total_memory = torch.cuda.get_device_properties(device).total_memory
    held = torch.cuda.memory_reserved(device)
    torch.cuda.set_per_process_memory_fraction((held + (1 << 30)) / total_memory, device)
    weight = torch.zeros(1, device=DEVICE, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    try:
        # Each step caches 15 buffers of 6 MiB; the allocator maps 20 MiB segments for them.
        cache = []
        for step in range(steps):
            cache.extend(torch.empty(6 * MiB, dtype=torch.uint8, device=DEVICE) for _ in range(15))
            optimizer.zero_grad(set_to_none=True)
            (weight * 2).sum().backward()
            optimizer.step()
        # Evict two in three: 600 MiB free, but in 12 MiB holes between kept buffers.
        kept = cache[::3]
        del cache
        big = torch.empty(64 * MiB, dtype=torch.uint8, device=DEVICE)
        print("large buffer fits:", big.numel(), len(kept))
    except torch.cuda.OutOfMemoryError:
        print("out of memory: the free memory is fragmented")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


def race_part(rounds: int) -> None:
    side = torch.cuda.Stream()
    source = torch.randn(1 << 22, device=DEVICE)
    for _ in range(rounds):
        buffer = torch.empty_like(source)
        with torch.cuda.stream(side):
            torch.mul(source, 2.0, out=buffer)
        # Missing: torch.cuda.current_stream().wait_stream(side)
        result = buffer.sum()
    torch.cuda.synchronize()
    print("sum", float(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("sync", "memory", "race", "all"), default="all")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if args.part in ("sync", "all"):
        sync_part(args.steps)
    if args.part in ("memory", "all"):
        memory_part(10)
    if args.part in ("race", "all"):
        race_part(3)


if __name__ == "__main__":
    main()

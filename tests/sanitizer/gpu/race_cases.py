"""The eight race cases of the race-detection issue, each racy and synchronized.

Shared by tests/sanitizer/gpu/test_race_gpu.py and bench/csan_comparison.py
(which runs each racy form under torch's CSAN and under torchlint). Every
function runs its case on the GPU and returns; the detector under test decides
what it saw. Nothing here imports torchlint.
"""
from __future__ import annotations

import os
import tempfile

import torch

N = 1 << 20  # elements: large enough that kernels overlap in time


def _side():
    return torch.cuda.Stream()


# 1. the classic case (the CSAN docs' example) -------------------------------------

def classic(synchronized: bool) -> None:
    side = _side()
    a = torch.rand(N, device="cuda")
    if synchronized:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.mul(a, 5, out=a)
    if synchronized:
        torch.cuda.current_stream().wait_stream(side)
    a.sum()


# 2. overlapping views at different offsets --------------------------------------------

def views(synchronized: bool) -> None:
    side = _side()
    x = torch.zeros(1000, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x[0:500].mul_(2)
    x[500:1000].sum()  # disjoint: never a race
    if synchronized:
        torch.cuda.current_stream().wait_stream(side)
    x[250:750].sum()


# 3. allocator reuse without record_stream ------------------------------------------------

def reuse(synchronized: bool) -> None:
    side = _side()
    x = torch.ones(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy
        y = x * 2
    if synchronized:
        x.record_stream(side)
    del x
    z = torch.empty(N, device="cuda")  # the allocator hands x's block out again
    z.fill_(0)
    torch.cuda.current_stream().wait_stream(side)
    del y, z


# 4. the transfer-stream prefetcher -------------------------------------------------------

def prefetcher(synchronized: bool) -> None:
    side = _side()
    weight = torch.randn(1024, 1024, device="cuda")
    host = torch.randn(256, 1024).pin_memory()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        batch = host.to("cuda", non_blocking=True)
    if synchronized:
        torch.cuda.current_stream().wait_stream(side)
        batch.record_stream(torch.cuda.current_stream())
    (batch @ weight).relu_()


# 5. asynchronous collectives ----------------------------------------------------------------

def collective(synchronized: bool) -> None:
    import torch.distributed as dist

    created = False
    if not dist.is_initialized():
        store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
        backend = "nccl" if dist.is_nccl_available() else "gloo"
        dist.init_process_group(backend, store=store, rank=0, world_size=1)
        created = True
    try:
        t = torch.ones(N, device="cuda")
        work = dist.all_reduce(t, async_op=True)
        if synchronized:
            work.wait()
        t.mul_(2)
        if not synchronized:
            work.wait()
        torch.cuda.synchronize()
    finally:
        if created:
            dist.destroy_process_group()


# 6. a user Triton kernel on a side stream -------------------------------------------------------

_triton_kernel = None


def _add_one_kernel():
    global _triton_kernel
    if _triton_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def add_one(x_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)

        _triton_kernel = add_one
    return _triton_kernel


def triton_kernel(synchronized: bool) -> None:
    kernel = _add_one_kernel()
    side = _side()
    x = torch.zeros(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        kernel[(N // 1024,)](x, N, BLOCK=1024)
    if synchronized:
        torch.cuda.current_stream().wait_stream(side)
    x.sum()


# 7. a CUDA graph replayed on a side stream -----------------------------------------------------

def graph(synchronized: bool) -> None:
    x = torch.ones(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    warm = _side()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        y.copy_(x * 2)
    torch.cuda.current_stream().wait_stream(warm)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y.copy_(x * 2)
    side = _side()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g.replay()
    if synchronized:
        torch.cuda.current_stream().wait_stream(side)
    y.sum()
    torch.cuda.synchronize()


# 8. events: recorded before the write vs after ----------------------------------------------------

def event(synchronized: bool) -> None:
    side = _side()
    done = torch.cuda.Event()
    x = torch.zeros(N, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        if not synchronized:
            done.record()  # too early: before the write
        x.add_(1)
        if synchronized:
            done.record()
    done.wait()
    x.sum()


# 9. the CSAN docs' example exactly: a tiny kernel, done before the stream exists ------

def finished_before_stream(synchronized: bool) -> None:
    """Racy whether or not the GPU happened to finish ``rand``: nothing orders the side stream after it."""
    a = torch.rand(4, 2, device="cuda")
    if synchronized:
        a.sum().item()  # a host sync: the default stream's work is done before the side stream starts
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.mul(a, 5, out=a)


CASES = {
    "1 classic": classic,
    "2 overlapping views": views,
    "3 allocator reuse": reuse,
    "4 prefetcher": prefetcher,
    "5 async collective": collective,
    "6 triton kernel": triton_kernel,
    "7 cuda graph replay": graph,
    "8 event before write": event,
    "9 finished before the stream": finished_before_stream,
}


def training_loop(steps: int = 6) -> None:
    """A correct multi-stream training loop: prefetch on a side stream, train on the default one."""
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    copy_stream = torch.cuda.Stream()
    host_batches = [torch.randn(64, 512).pin_memory() for _ in range(3)]
    host_labels = [torch.randint(0, 10, (64,)).pin_memory() for _ in range(3)]

    def load(i):
        copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            return (host_batches[i % 3].to("cuda", non_blocking=True),
                    host_labels[i % 3].to("cuda", non_blocking=True))

    next_batch = load(0)
    for step in range(steps):
        torch.cuda.current_stream().wait_stream(copy_stream)
        inputs, labels = next_batch
        inputs.record_stream(torch.cuda.current_stream())
        labels.record_stream(torch.cuda.current_stream())
        next_batch = load(step + 1)
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()

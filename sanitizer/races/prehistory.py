"""What the race check records before it switches on, so that findings never depend on timing.

Until a second stream (a collective, a graph capture) appears, the race check
analyses no op: a single-stream program pays nothing per op. When the
analysis switches on ("activation"), one question about the earlier
default-stream work remains: which live tensors may it still be writing?
A later side-stream access to such a tensor, made without ``wait_stream``,
races with it.

Asking the GPU (``default_stream().query()``) answers a different question,
whether that work *happened to finish*, and made the CSAN documentation's
example (``a = torch.rand(...)``, then ``torch.mul(a, 5, out=a)`` on a new
stream) pass or fail with the GPU's speed. The answer here depends only on
the program's order of operations:

* The check starts with a device synchronize: work issued before the check
  existed has finished when the check's history begins (one sync per session).
* At activation, a block live then is booked as written by its stream's
  unfinished work unless no host sync came after the allocator handed it
  out. The allocator knows every live block and its stream, so nothing per op
  is needed before activation. Two routes record the syncs:

  - **Under the native tap** (its gpu_trace filter, ``race_tap.cpp``), the
    filter keeps the ledger in C++: it notes the address of every block the
    allocator hands out, forgets it when the block is freed, and clears the
    notes at every host sync torch reports (device, stream and event syncs,
    and the implicit ones: ``.item()``, ``.cpu()``, blocking copies go
    through the same ``c10::cuda`` functions that sync debug mode watches).
    A sync costs no snapshot, only torch's gpu_trace hook (one call into
    Python, as after activation); activation takes one
    ``memory_snapshot()`` and keeps the live blocks still noted.
  - **Otherwise** every host sync seen before activation
    (``torch.cuda.synchronize()``, ``Stream.synchronize()``,
    ``Event.synchronize()``, and the implicit ones that torch's sync debug
    mode reports) is recorded with the caching allocator's live blocks at that
    moment (``memory_snapshot()``, about 0.3 ms on a transformer's allocator);
    a block live at the latest sync counts as finished.

What this cannot see without per-op tracking (and so does not report):
default-stream writes, after the latest sync, to a block that was live at
that sync; on the snapshot route also a block freed and reallocated with the
same address and size after it. Both err towards silence, never towards a
false alarm, and both are decided by program order alone.
``Event.synchronize()`` counts as a sync at the call, not at the event's
record.
"""

from __future__ import annotations

from typing import FrozenSet, Iterable, List, Tuple

# (device, stream, start address, size) of one live block of the caching allocator.
Block = Tuple[int, int, int, int]


def live_blocks(segments: Iterable[dict]) -> FrozenSet[Block]:
    """The allocated blocks of a ``torch.cuda.memory_snapshot()``, each with its device and stream."""
    blocks = set()
    for segment in segments:
        address = segment.get("address", 0)
        device = segment.get("device", 0)
        stream = segment.get("stream", 0)
        for block in segment.get("blocks", ()):
            size = block.get("size", 0)
            if size and block.get("state") == "active_allocated":
                blocks.add((device, stream, address, size))
            address += size
    return frozenset(blocks)


class HostSyncLedger:
    """The host syncs seen before activation, with the blocks that were live at the latest."""

    def __init__(self) -> None:
        self.syncs = 0
        self._live_at_last_sync: FrozenSet[Block] = frozenset()

    def host_sync(self, live: FrozenSet[Block]) -> None:
        """The host waited for every stream's earlier work: ``live`` is finished from here on."""
        self.syncs += 1
        self._live_at_last_sync = live

    def allocated_since_sync(self, live: FrozenSet[Block], syncs: int, addresses: Iterable[int]) -> List[Block]:
        """The native tap's record instead of a snapshot per sync: the blocks of ``live`` handed out after the
        last of ``syncs`` host syncs (``addresses``: their start addresses), sorted."""
        self.syncs += syncs
        handed_out = set(addresses)
        return sorted(block for block in live if block[2] in handed_out)

    def unfinished(self, live: FrozenSet[Block]) -> List[Block]:
        """The blocks of ``live`` whose writes no recorded sync has ordered, sorted (a stable report)."""
        return sorted(live - self._live_at_last_sync)

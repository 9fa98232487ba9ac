"""The memory check's view of PyTorch's CUDA caching allocator: its counters, and the one adapter that calls torch.

``AllocatorStats`` holds the counters the check reads from one stats call;
``TorchAllocatorSource`` is the only code of the memory check that calls
torch (the CPU tests give ``MemoryCheck`` a fake source with the same
methods). Cost model in ``check.py``'s docstring.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

# TORCHLINT_MEMORY_HISTORY=1: the allocator records a Python stack per allocation
# (+~24% on a launch-bound step), so a wasteful segment names its exact line.
HISTORY_ENTRIES = 100_000


# ------------------------------------------------------------------ stats


@dataclass(frozen=True)
class AllocatorStats:
    """The allocator counters the check reads, from one stats call."""

    allocated: int = 0
    reserved: int = 0
    active: int = 0
    requested: int = 0
    inactive_split_bytes: int = 0
    inactive_split: int = 0
    segments: int = 0
    allocated_peak: int = 0
    reserved_peak: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_sync_all_streams: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0

    _POOLED = (
        ("allocated", "allocated_bytes", "current"),
        ("reserved", "reserved_bytes", "current"),
        ("active", "active_bytes", "current"),
        ("requested", "requested_bytes", "current"),
        ("inactive_split_bytes", "inactive_split_bytes", "current"),
        ("inactive_split", "inactive_split", "current"),
        ("segments", "segment", "current"),
        ("allocated_peak", "allocated_bytes", "peak"),
        ("reserved_peak", "reserved_bytes", "peak"),
    )
    _SCALARS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")

    @classmethod
    def from_nested(cls, stats: Mapping[str, Any]) -> "AllocatorStats":
        """From ``torch.cuda.memory_stats_as_nested_dict()`` (or the raw C call)."""
        values: Dict[str, int] = {}
        for field_name, stat, which in cls._POOLED:
            values[field_name] = int(((stats.get(stat) or {}).get("all") or {}).get(which, 0))
        for name in cls._SCALARS:
            values[name] = int(stats.get(name, 0) or 0)
        return cls(**values)

    @classmethod
    def from_flat(cls, stats: Mapping[str, Any]) -> "AllocatorStats":
        """From ``torch.cuda.memory_stats()``'s flat ``"allocated_bytes.all.current"`` keys."""
        values: Dict[str, int] = {}
        for field_name, stat, which in cls._POOLED:
            values[field_name] = int(stats.get(f"{stat}.all.{which}", 0))
        for name in cls._SCALARS:
            values[name] = int(stats.get(name, 0) or 0)
        return cls(**values)

    @property
    def reserved_unallocated(self) -> int:
        return max(0, self.reserved - self.allocated)

    @property
    def slack(self) -> float:
        return self.reserved_unallocated / self.reserved if self.reserved else 0.0

    def to_json(self) -> Dict[str, int]:
        return asdict(self)


# ------------------------------------------------------------------ torch adapter


class TorchAllocatorSource:
    """The only code in this module that calls torch."""

    def __init__(self, torch: Any, device: Optional[int] = None) -> None:
        self._torch = torch
        self._device = device
        self._raw_stats = getattr(torch._C, "_cuda_memoryStats", None)

    @classmethod
    def create(cls, device: Optional[int] = None) -> Optional["TorchAllocatorSource"]:
        try:
            import torch
        except ImportError:
            return None
        try:
            if torch.cuda.device_count() == 0:
                return None
        except Exception:
            return None
        return cls(torch, device)

    @property
    def device(self) -> int:
        if self._device is None:
            self._device = self._torch.cuda.current_device()
        return self._device

    def is_initialized(self) -> bool:
        return bool(self._torch.cuda.is_initialized())

    def device_for_thread(self) -> int:
        """The device to read from a background thread, whose own current device is always 0.

        The program's device once a main-thread call resolved it; until then
        the rank's ``LOCAL_RANK`` under torchrun (``set_device(local_rank)``
        is the convention), else 0.
        """
        if self._device is not None:
            return self._device
        local = os.environ.get("LOCAL_RANK", "")
        if local.isdigit():
            try:
                if int(local) < self._torch.cuda.device_count():
                    return int(local)
            except Exception:
                pass
        return 0

    def on_init(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once CUDA is initialized, without initializing it."""
        lazy_call = getattr(self._torch.cuda, "_lazy_call", None)
        if self.is_initialized() or lazy_call is None:
            callback()
        else:
            lazy_call(callback)

    def stats(self, device: Optional[int] = None) -> AllocatorStats:
        index = self.device if device is None else device
        if self._raw_stats is not None:
            try:
                return AllocatorStats.from_nested(self._raw_stats(index))
            except Exception:
                self._raw_stats = None
        return AllocatorStats.from_nested(self._torch.cuda.memory_stats_as_nested_dict(index))

    def mem_get_info(self, device: Optional[int] = None) -> Tuple[int, int]:
        free, total = self._torch.cuda.mem_get_info(self.device if device is None else device)
        return int(free), int(total)

    def cap(self, total: int, device: Optional[int] = None) -> int:
        """The process's allowed bytes: total times ``set_per_process_memory_fraction``."""
        get_fraction = getattr(self._torch.cuda, "get_per_process_memory_fraction", None)
        if get_fraction is None:
            return total
        try:
            return int(total * float(get_fraction(self.device if device is None else device)))
        except Exception:
            return total

    def snapshot(self, device: Optional[int] = None) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
        """(segments of this device, allocator_settings)."""
        index = self.device if device is None else device
        settings: Dict[str, Any] = {}
        private = getattr(self._torch.cuda.memory, "_snapshot", None)
        self._traces = None
        if private is not None:
            try:
                snap = private()
                segments = snap.get("segments", [])
                settings = dict(snap.get("allocator_settings") or {})
                self._traces = snap.get("device_traces") or None
            except Exception:
                segments = self._torch.cuda.memory_snapshot()
        else:
            segments = self._torch.cuda.memory_snapshot()
        return [s for s in segments if int(s.get("device", index)) == index], settings

    def segment_frames(self, address: int) -> Optional[List[Tuple[str, int, str]]]:
        """The stack that mapped the segment at ``address``, from the last snapshot's allocator history.

        Present only while memory history is recorded (``TORCHLINT_MEMORY_HISTORY=1``,
        or the program's own ``torch.cuda.memory._record_memory_history()``).
        """
        for device_trace in getattr(self, "_traces", None) or ():
            for entry in reversed(device_trace):
                if entry.get("action") in ("segment_alloc", "segment_map") and entry.get("addr") == address:
                    frames = entry.get("frames") or []
                    return [(f.get("filename", "?"), int(f.get("line", 0)), f.get("name", "?")) for f in frames]
        return None

    def record_history(self, enabled: bool) -> bool:
        """Switch the allocator's history (with Python stacks) on or off; False where torch lacks it."""
        record = getattr(self._torch.cuda.memory, "_record_memory_history", None)
        if record is None:
            return False
        if enabled:
            record(enabled="all", context="alloc", stacks="python", max_entries=HISTORY_ENTRIES)
        else:
            record(enabled=None)
        return True

    def current_stream(self, device: Optional[int] = None) -> Optional[int]:
        try:
            return int(self._torch.cuda.current_stream(self.device if device is None else device).cuda_stream)
        except Exception:
            return None

    def attach_oom_observer(self, callback: Callable[[int, int, int, int], None]) -> bool:
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return False
        attach(callback)
        return True

    def pci_bus_id(self) -> Optional[str]:
        try:
            props = self._torch.cuda.get_device_properties(self.device)
            return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        except Exception:
            return None

    def device_name(self) -> Optional[str]:
        try:
            return str(self._torch.cuda.get_device_name(self.device))
        except Exception:
            return None

    def alloc_conf(self) -> Optional[str]:
        return os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")

"""A background NVML sampler: device memory, this process's memory, GPU utilization.

One thread per sampler, one NVML handle, ``nvmlInit`` once per process (NVML
reference-counts init; torch's own ``torch.cuda.utilization()`` pays for init
and a handle lookup on every call, ~11 µs, so it is not used). pynvml's calls
go through ctypes, which releases the GIL while NVML works; each call still
takes the GIL back from the training thread when it returns, so a sample
makes few calls: memory and utilization every time, the process list on one
sample in ``PROCESS_LIST_EVERY``.

Each utilization sample also goes to ``on_sample`` (the session's timeline),
so that utilization is judged on the steady-state training steps alone
(``phases.py``); the sampler's own mean covers the whole measured run and is
only reported. Without pynvml, without a GPU or without permission the
sampler reports "unavailable" with the reason and produces no findings.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, List, Optional

from ..findings import NEAR_CAPACITY, Finding

DEFAULT_INTERVAL_S = 0.2  # 5 Hz
NEAR_CAPACITY_FRACTION = 0.9
# utilization.gpu lags 2-3 samples at 100 ms polling (measured).
LAG_SAMPLES = 2
# The process list is read on one sample in this many (once a second at 5 Hz): it is
# the sample's costliest part (two ctypes calls, each giving the GIL away and taking it
# back from the training thread), and per-process memory moves with the allocator's
# segments, which the memory check already follows at 20 Hz.
PROCESS_LIST_EVERY = 5

_init_lock = threading.Lock()
# The module objects themselves, not their ids: an id can be reused.
_initialized_modules: List[Any] = []


def _init_once(nvml: Any) -> None:
    """nvmlInit once per process per module object; never shut down (refcounted)."""
    with _init_lock:
        if any(module is nvml for module in _initialized_modules):
            return
        nvml.nvmlInit()
        _initialized_modules.append(nvml)


def _format_mib(n: Optional[int]) -> str:
    return "unknown" if n is None else f"{n / (1 << 20):.0f} MiB"


@dataclass
class NvmlSample:
    time: float
    used: int
    total: int
    utilization: Optional[int]
    process_used: Optional[int]
    others_used: Optional[int]


class NvmlSampler:
    """Samples one device in a daemon thread until ``stop()``."""

    def __init__(
        self,
        device_index: int = 0,
        *,
        pci_bus_id: Optional[str] = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        pid: Optional[int] = None,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
        keep_samples: int = 600,
        on_sample: Optional[Callable[[Optional[int]], None]] = None,
    ) -> None:
        if not 0.1 <= interval_s <= 0.5:
            raise ValueError("NVML sampling interval must be between 0.1 s and 0.5 s (2-10 Hz)")
        self.device_index = device_index
        self.pci_bus_id = pci_bus_id
        self.interval_s = interval_s
        self.pid = os.getpid() if pid is None else pid
        self._nvml = nvml
        self._clock = clock
        self.on_sample = on_sample  # each utilization reading, as it comes (the session's timeline)
        self._handle: Any = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.unavailable_reason: Optional[str] = None
        self.device_total: Optional[int] = None
        self.device_name: Optional[str] = None
        self.recent: Deque[NvmlSample] = collections.deque(maxlen=keep_samples)
        self._measure_from: Optional[float] = None
        self._process_usage: tuple = (None, None)  # the last list read: (own, others)
        self._reset_aggregates()

    def _reset_aggregates(self) -> None:
        self.samples = 0
        self.errors = 0
        self.peak_used = 0
        self.peak_process_used: Optional[int] = None
        self.peak_others_used: Optional[int] = None
        self._util_seen = 0
        self._util_count = 0
        self._util_sum = 0.0
        self._util_min: Optional[int] = None
        self._util_max: Optional[int] = None
        self._first_time: Optional[float] = None
        self._last_time: Optional[float] = None

    # -------------------------------------------------------------- lifecycle

    @property
    def available(self) -> bool:
        return self._handle is not None

    def open(self) -> bool:
        """Init NVML and take the one handle; False (with a reason) if impossible."""
        if self._handle is not None:
            return True
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml  # type: ignore[no-redef]
            except ImportError:
                self.unavailable_reason = "pynvml (nvidia-ml-py) is not installed"
                return False
            self._nvml = nvml
        try:
            _init_once(nvml)
            handle = None
            if self.pci_bus_id and hasattr(nvml, "nvmlDeviceGetHandleByPciBusId_v2"):
                try:
                    handle = nvml.nvmlDeviceGetHandleByPciBusId_v2(self.pci_bus_id)
                except Exception:
                    handle = None
            if handle is None:
                handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
            self.device_total = int(nvml.nvmlDeviceGetMemoryInfo(handle).total)
            try:
                name = nvml.nvmlDeviceGetName(handle)
                self.device_name = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:
                self.device_name = None
        except Exception as exc:  # NVMLError_LibraryNotFound, NoPermission, ...
            self.unavailable_reason = f"NVML unavailable: {exc}"
            return False
        self._handle = handle
        return True

    def start(self) -> bool:
        if self._thread is not None:
            return True
        if not self.open():
            return False
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="torchlint-nvml", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stop the thread and wait for it; idempotent."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=max(2.0, 4 * self.interval_s))
        self._thread = None

    def _run(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def mark_measurement_start(self) -> None:
        """Judge utilization only from now on (the warm-up is over)."""
        with self._lock:
            self._measure_from = self._clock()
            self._util_seen = self._util_count = 0
            self._util_sum = 0.0
            self._util_min = self._util_max = None

    # -------------------------------------------------------------- sampling

    def processes(self) -> Optional[List[tuple]]:
        """``[(pid, used_bytes_or_None), ...]`` on the device, or None."""
        if self._handle is None:
            return None
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:
            return None
        return [(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory)) for p in procs]

    def process_usage(self) -> tuple:
        """(this process's bytes, other processes' bytes); None where unknown."""
        procs = self.processes()
        if procs is None:
            return None, None
        own = [used for pid, used in procs if pid == self.pid and used is not None]
        others = [used for pid, used in procs if pid != self.pid and used is not None]
        return (sum(own) if own else None), sum(others)

    def sample_once(self) -> Optional[NvmlSample]:
        if self._handle is None:
            return None
        nvml = self._nvml
        now = self._clock()
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception:
            with self._lock:
                self.errors += 1
            return None
        try:
            utilization: Optional[int] = int(nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
        except Exception:  # NotSupported on some devices and under MIG
            utilization = None
        if self.on_sample is not None:
            self.on_sample(utilization)
        if self.samples % PROCESS_LIST_EVERY == 0:
            self._process_usage = self.process_usage()
        own, others = self._process_usage
        sample = NvmlSample(now, int(memory.used), int(memory.total), utilization, own, others)
        with self._lock:
            self.samples += 1
            self.recent.append(sample)
            self.peak_used = max(self.peak_used, sample.used)
            if own is not None:
                self.peak_process_used = max(self.peak_process_used or 0, own)
            if others is not None:
                self.peak_others_used = max(self.peak_others_used or 0, others)
            if self._first_time is None:
                self._first_time = now
            self._last_time = now
            if utilization is not None and (self._measure_from is None or now >= self._measure_from):
                self._util_seen += 1
                if self._util_seen > LAG_SAMPLES:
                    self._util_count += 1
                    self._util_sum += utilization
                    self._util_min = utilization if self._util_min is None else min(self._util_min, utilization)
                    self._util_max = utilization if self._util_max is None else max(self._util_max, utilization)
        return sample

    # -------------------------------------------------------------- results

    def _measured_seconds(self) -> float:
        """Sampled time since the measurement started (start-up and tap builds excluded)."""
        if self._first_time is None or self._last_time is None:
            return 0.0
        start = self._first_time if self._measure_from is None else max(self._first_time, self._measure_from)
        return max(0.0, self._last_time - start)

    @property
    def mean_utilization(self) -> Optional[float]:
        return self._util_sum / self._util_count if self._util_count else None

    def summary(self) -> Dict[str, Any]:
        if self._handle is None:
            return {"available": False, "reason": self.unavailable_reason or "not started"}
        with self._lock:
            duration = self._measured_seconds()
            return {
                "available": True,
                "device_name": self.device_name,
                "interval_s": self.interval_s,
                "samples": self.samples,
                "errors": self.errors,
                "duration_s": round(duration, 3),
                "device_total_bytes": self.device_total,
                "peak_used_bytes": self.peak_used,
                "peak_used_fraction": round(self.peak_used / self.device_total, 4) if self.device_total else None,
                "peak_process_used_bytes": self.peak_process_used,
                "peak_other_processes_bytes": self.peak_others_used,
                "utilization_samples": self._util_count,
                "utilization_mean_percent": None if self.mean_utilization is None else round(self.mean_utilization, 1),
                "utilization_min_percent": self._util_min,
                "utilization_max_percent": self._util_max,
            }

    def findings(self, *, near_capacity_fraction: float = NEAR_CAPACITY_FRACTION) -> List[Finding]:
        """Device memory near its capacity (a note). Utilization is judged by phase, in the memory verdicts."""
        if self._handle is None:
            return []
        found: List[Finding] = []
        if self.device_total and self.peak_used >= near_capacity_fraction * self.device_total:
            found.append(
                Finding(
                    kind=NEAR_CAPACITY,
                    severity="info",  # a risk to know of, not a cost the run paid
                    message=(
                        f"device memory peaked at {self.peak_used / self.device_total:.0%} of "
                        f"{_format_mib(self.device_total)} (NVML, all processes)"
                    ),
                    fix_hint="little headroom left: an input of another shape may OOM; reduce peak memory",
                    details={
                        "source": "nvml",
                        "peak_used_bytes": self.peak_used,
                        "device_total_bytes": self.device_total,
                        "peak_process_used_bytes": self.peak_process_used,
                        "peak_other_processes_bytes": self.peak_others_used,
                        "threshold_fraction": near_capacity_fraction,
                    },
                )
            )
        return found

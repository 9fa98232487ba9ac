"""The NVML sampler against a fake pynvml module."""
import sys
import time
import types

import pytest

from torchlint.sanitizer.memory import nvml as nvml_mod
from torchlint.sanitizer.memory.nvml import NvmlSampler

MiB = 1 << 20
GiB = 1 << 30


class NVMLError(Exception):
    pass


class FakeNvml:
    def __init__(self, total=80 * GiB, used=10 * GiB, util=90, procs=((100, 2 * GiB), (200, 3 * GiB))):
        self.NVMLError = NVMLError
        self.total = total
        self.used = used
        self.util = util
        self.procs = list(procs)
        self.init_calls = 0
        self.handles = []
        self.fail_init = False
        self.util_unsupported = False

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")
        self.init_calls += 1

    def nvmlDeviceGetHandleByIndex(self, index):
        self.handles.append(("index", index))
        return f"handle{index}"

    def nvmlDeviceGetHandleByPciBusId_v2(self, bus_id):
        self.handles.append(("pci", bus_id))
        return f"handle-{bus_id}"

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(total=self.total, used=self.used, free=self.total - self.used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.util_unsupported:
            raise NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=self.util, memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.procs]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def sampler(fake, **kwargs):
    clock = Clock()
    s = NvmlSampler(0, nvml=fake, pid=100, clock=clock, **kwargs)
    return s, clock


def run(s, clock, n):
    for _ in range(n):
        clock.now += 0.2
        s.sample_once()


def test_each_utilization_sample_goes_to_the_timeline_and_the_sampler_judges_none():
    """Utilization is judged on the steady-state steps (phases.py), from the samples the sampler hands on."""
    fake = FakeNvml(util=20)
    seen = []
    s, clock = sampler(fake, on_sample=seen.append)
    assert s.open()
    run(s, clock, 40)  # 8 s of a starved GPU
    assert seen == [20] * 40
    assert s.findings() == []
    assert s.summary()["utilization_mean_percent"] == 20  # the whole measured run: reported


def test_busy_gpu_is_not_flagged():
    s, clock = sampler(FakeNvml(util=97))
    s.open()
    run(s, clock, 30)
    assert s.findings() == []
    assert s.summary()["utilization_mean_percent"] == 97


def test_the_first_samples_are_skipped_for_lag():
    fake = FakeNvml(util=0)
    s, clock = sampler(fake)
    s.open()
    run(s, clock, nvml_mod.LAG_SAMPLES)  # idle while NVML's window catches up
    fake.util = 100
    run(s, clock, 20)
    assert s.mean_utilization == 100


def test_measurement_starts_after_warmup():
    fake = FakeNvml(util=5)
    s, clock = sampler(fake)
    s.open()
    run(s, clock, 20)  # warm-up: compilation, data loading
    s.mark_measurement_start()
    fake.util = 95
    run(s, clock, 20)
    assert s.mean_utilization == 95
    assert s.findings() == []


def test_peak_near_capacity_and_process_usage():
    fake = FakeNvml(total=80 * GiB, used=75 * GiB)
    s, clock = sampler(fake)
    s.open()
    run(s, clock, 3)
    findings = {f.kind: f for f in s.findings()}
    assert "near-capacity" in findings
    assert findings["near-capacity"].details["peak_used_bytes"] == 75 * GiB
    assert s.process_usage() == (2 * GiB, 3 * GiB)
    summary = s.summary()
    assert summary["peak_process_used_bytes"] == 2 * GiB
    assert summary["peak_other_processes_bytes"] == 3 * GiB
    assert summary["device_name"] == "Fake GPU"


def test_process_usage_when_this_process_is_not_listed():
    s, _ = sampler(FakeNvml(procs=[(7, 1 * GiB), (8, None)]))
    s.open()
    assert s.process_usage() == (None, 1 * GiB)


def test_utilization_not_supported_is_no_data():
    fake = FakeNvml()
    fake.util_unsupported = True
    s, clock = sampler(fake)
    s.open()
    run(s, clock, 20)
    assert s.mean_utilization is None
    assert s.findings() == []
    assert s.summary()["samples"] == 20


def test_without_pynvml_the_sampler_is_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    s = NvmlSampler(0)
    assert s.start() is False
    assert s.summary() == {"available": False, "reason": "pynvml (nvidia-ml-py) is not installed"}
    assert s.findings() == []
    s.stop()


def test_nvml_init_failure_is_unavailable():
    fake = FakeNvml()
    fake.fail_init = True
    s, _ = sampler(fake)
    assert s.start() is False
    assert "Driver Not Loaded" in s.summary()["reason"]


def test_init_once_and_one_handle_per_sampler():
    fake = FakeNvml()
    a, _ = sampler(fake)
    b, _ = sampler(fake)
    a.open()
    a.open()
    b.open()
    assert fake.init_calls == 1
    assert fake.handles == [("index", 0), ("index", 0)]


def test_handle_by_pci_bus_id_when_known():
    fake = FakeNvml()
    s = NvmlSampler(3, pci_bus_id="00000000:1A:00.0", nvml=fake)
    assert s.open()
    assert fake.handles == [("pci", "00000000:1A:00.0")]


def test_thread_samples_in_the_background_and_stops_cleanly():
    fake = FakeNvml()
    s = NvmlSampler(0, nvml=fake, interval_s=0.1)
    assert s.start()
    deadline = time.monotonic() + 5
    while s.samples < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    s.stop()
    assert s.samples >= 2
    assert s._thread is None
    count = s.samples
    time.sleep(0.25)
    assert s.samples == count  # no sampling after stop
    s.stop()  # idempotent


def test_interval_must_be_2_to_10_hz():
    with pytest.raises(ValueError):
        NvmlSampler(0, nvml=FakeNvml(), interval_s=1.0)
    with pytest.raises(ValueError):
        NvmlSampler(0, nvml=FakeNvml(), interval_s=0.05)


def test_an_idle_run_is_reported_by_the_sampler_not_judged():
    s, clock = sampler(FakeNvml(util=0))
    s.open()
    run(s, clock, 20)
    assert s.findings() == []
    assert s.summary()["utilization_mean_percent"] == 0


def test_start_up_before_the_measurement_starts_is_not_the_users_time():
    fake = FakeNvml(util=0)
    s, clock = sampler(fake)
    s.open()
    run(s, clock, 150)  # 30 s idle: the native tap building, imports
    s.mark_measurement_start()
    fake.util = 95
    run(s, clock, 30)
    assert s.findings() == []
    assert s.summary()["duration_s"] == pytest.approx(6.0)


def test_the_process_list_is_read_on_every_fifth_sample():
    class Counting(FakeNvml):
        process_reads = 0

        def nvmlDeviceGetComputeRunningProcesses(self, handle):
            self.process_reads += 1
            return super().nvmlDeviceGetComputeRunningProcesses(handle)

    fake = Counting()
    s, clock = sampler(fake)
    s.open()
    run(s, clock, 10)
    assert fake.process_reads == 10 // nvml_mod.PROCESS_LIST_EVERY
    # The samples between two reads carry the last list's figures.
    assert [(x.process_used, x.others_used) for x in s.recent] == [(2 * GiB, 3 * GiB)] * 10
    fake.procs = [(100, 4 * GiB)]
    run(s, clock, nvml_mod.PROCESS_LIST_EVERY)
    assert s.summary()["peak_process_used_bytes"] == 4 * GiB

"""The memory check: allocator health, fragmentation, OOM verdicts and GPU utilization.

- ``check.py``: ``MemoryCheck``, the hooks (the step sample, the watcher
  thread, triggered snapshots, the OOM observer) and the state they fill;
- ``record.py``: that state frozen (``MemoryRecord``), what every verdict reads;
- ``verdicts.py``: the findings and the summary, pure functions of a record;
- ``allocator.py``: every call into torch's caching allocator (``TorchAllocatorSource``);
- ``fragmentation.py``: snapshot metrics, the fragmentation and OOM judges;
- ``nvml.py``: the NVML sampler (device memory, utilization).
"""

"""The race check: cross-stream data races, found from the program's order of operations.

- ``check.py``: ``RaceCheck``, its lifecycle and activation, the per-op
  analysis, and the ``RaceSink`` its hooks tell what the program did;
- ``hooks.py``: every hook it installs in torch (wrappers, gpu_trace
  callbacks, the dispatch-mode fallback) behind the narrow ``RaceSink``;
- ``happens_before.py``: the engine (vector clocks over streams, events and
  host syncs; accesses by byte range), plain Python;
- ``ops.py``: how an op's accesses are classified (the Python twin of the tap);
- ``native_tap.py`` and ``race_tap.cpp``: the C++ op tap, built on the user's machine;
- ``prehistory.py``: what ran before activation, decided from host syncs;
- ``report.py``: a race as a finding, with the user's names.

``docs/races.md`` explains the design.
"""

"""The sync check: every host-device synchronization, at the user's line.

- ``check.py``: ``SyncCheck``, the hooks (timed wrappers on the entry points
  that sync, torch's sync warning) and the per-site record they fill;
- ``kinds.py``: what a sync is (its kind, the static rule for the same line,
  the fix) and how a warning-path sync is classified;
- ``verdicts.py``: which sites are findings, as pure functions of the frozen
  site records.
"""

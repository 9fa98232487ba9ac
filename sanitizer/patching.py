"""Replacing attributes of torch's modules and classes, and putting them back exactly.

Every check that wraps a torch function (the sync check's timed wrappers, the
race check's triggers) goes through here, so there is one rule for undoing a
patch: an attribute the owner defined itself is set back to the very object
it held (a class's ``staticmethod``, not the function it wraps); an attribute
the owner only inherited is deleted again, so the base class shows through
and no copy is left on the subclass. Patches are undone in reverse order, so
two checks wrapping the same function (the sync check, then the race check,
around ``torch.cuda.synchronize``) unwind cleanly.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

# torch's sync debug mode in warn mode: the text of each sync's warning, and of the
# warning that switching the mode on gives (the sync and race checks both listen).
SYNC_WARNING = "called a synchronizing CUDA operation"
PROTOTYPE_WARNING = "Synchronization debug mode is a prototype feature"


class Patch:
    """One attribute replaced on a module or class, restorable exactly.

    ``make`` receives the attribute's current value (what the replacement
    wraps) and returns the replacement; nothing changes until ``apply()``.
    """

    __slots__ = ("owner", "name", "original", "had_own", "replacement")

    def __init__(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        self.owner = owner
        self.name = name
        self.had_own = name in vars(owner)
        self.original = vars(owner)[name] if self.had_own else getattr(owner, name)
        self.replacement = make(getattr(owner, name))

    def apply(self) -> None:
        setattr(self.owner, self.name, self.replacement)

    def restore(self) -> None:
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:
            try:
                delattr(self.owner, self.name)
            except AttributeError:
                pass


class Patcher:
    """The patches one check holds: applied as made, restored together, last first."""

    def __init__(self) -> None:
        self._patches: List[Patch] = []

    def replace(self, owner: Any, name: str, replacement: Any) -> Patch:
        """Put ``replacement`` in place of ``owner.name`` now."""
        return self.wrap(owner, name, lambda _current: replacement)

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Patch:
        """Put ``make(current value)`` in place of ``owner.name`` now."""
        patch = Patch(owner, name, make)
        patch.apply()
        self._patches.append(patch)
        return patch

    def restore_all(self) -> None:
        while self._patches:
            self._patches.pop().restore()

    def __len__(self) -> int:
        return len(self._patches)


class WarningHook:
    """``warnings.showwarning`` wrapped for the warnings whose text starts with ``prefix``, undone exactly.

    ``on_match()`` runs for each such warning and returns True to swallow it,
    False to hand it to the hook that was there before (another check's, or
    Python's). An ``"always"`` filter for the text keeps Python's
    once-per-location rule from collapsing repeats and ``-W error`` from
    turning them into exceptions. Install it inside pytest's per-test
    ``catch_warnings``: that context bypasses hooks installed before it.
    ``listening(prefix)`` counts the hooks in place for a text, so a check
    that could silence the warning at its source knows whether another needs it.
    """

    _in_place: Dict[str, int] = {}  # prefix -> hooks installed and not yet removed

    @classmethod
    def listening(cls, prefix: str) -> int:
        return cls._in_place.get(prefix, 0)

    def __init__(self, prefix: str, on_match: Callable[[], bool]) -> None:
        self.prefix = prefix
        self.on_match = on_match
        self._previous: Any = None
        self._installed: Any = None
        self._filters: List[tuple] = []

    def install(self) -> None:
        import re
        import warnings

        previous = warnings.showwarning
        prefix, on_match = self.prefix, self.on_match

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if str(message).startswith(prefix) and on_match():
                return None
            return previous(message, category, filename, lineno, file, line)

        self._previous, self._installed = previous, showwarning
        warnings.showwarning = showwarning
        WarningHook._in_place[prefix] = WarningHook.listening(prefix) + 1
        before = list(warnings.filters)
        warnings.filterwarnings("always", message=re.escape(prefix))
        self._filters = [entry for entry in warnings.filters if entry not in before]

    def remove(self) -> None:
        import warnings

        if self._installed is not None:
            if warnings.showwarning is self._installed:
                warnings.showwarning = self._previous
            self._installed = None
            WarningHook._in_place[self.prefix] = WarningHook.listening(self.prefix) - 1
        if self._filters:
            for entry in self._filters:
                try:
                    # typeshed types it as a Sequence; at run time it is the list Python itself mutates.
                    warnings.filters.remove(entry)  # type: ignore[attr-defined]
                except ValueError:
                    pass
            # Private, not in typeshed: tells the per-module once-registries that the filters changed.
            warnings._filters_mutated()  # type: ignore[attr-defined]
            self._filters = []

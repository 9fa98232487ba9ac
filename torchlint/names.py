"""Import-aware names, without libcst's (slow) scope and qualified-name providers.

One table per module maps each locally bound import name to its full dotted
name, so ``import torch as T``, ``from torch import cuda`` and
``from torch.cuda.amp import GradScaler as GS`` all resolve to torch names.
The table is flat (not per scope): an import inside a function is visible to
the rest of the module. That over-approximation is cheap and, for import
names, almost never wrong in practice.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import libcst as cst


def dotted_name(node: cst.CSTNode) -> Optional[str]:
    """``a.b.c`` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def last_name(node: cst.CSTNode) -> Optional[str]:
    """The final identifier of a Name/Attribute (``c`` for ``a.b.c``)."""
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Name):
        return node.value
    return None


def _module_name(node: Union[cst.Attribute, cst.Name]) -> str:
    return dotted_name(node) or ""


class ImportTable:
    def __init__(self) -> None:
        self.aliases: Dict[str, str] = {}
        # ``from .engine import f`` -> {"f": ".engine.f"}: never a torch name,
        # kept apart; the project index resolves them against the file.
        self.relative: Dict[str, str] = {}
        # ``from models import *`` -> ["models"]: modules whose names are bound
        # unseen; the project index looks a name up in them (``candidates``).
        self.star_modules: List[str] = []

    def add(self, node: Union[cst.Import, cst.ImportFrom]) -> None:
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _module_name(alias.name)
                if alias.asname is not None:
                    self.aliases[_asname(alias)] = full
                else:
                    head = full.split(".", 1)[0]
                    self.aliases[head] = head
            return
        if isinstance(node.names, cst.ImportStar):
            # `from torch import *` binds names we cannot see; a project module's may be looked up
            dots = "." * len(node.relative)
            module = _module_name(node.module) if node.module is not None else ""
            if module != "torch" and not module.startswith("torch."):
                self.star_modules.append(dots + module)
            return
        table = self.aliases
        if node.relative:
            dots = "." * len(node.relative)
            prefix = f"{dots}{_module_name(node.module)}." if node.module is not None else dots
            table = self.relative
        elif node.module is not None:
            prefix = _module_name(node.module) + "."
        else:
            return
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else _module_name(alias.name)
            local = _asname(alias) if alias.asname is not None else name
            table[local] = prefix + name

    def qualify(self, dotted: Optional[str]) -> Optional[str]:
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        full = self.aliases.get(head)
        if full is None:
            return None
        return f"{full}.{rest}" if rest else full

    def qualified_name(self, node: cst.CSTNode) -> Optional[str]:
        return self.qualify(dotted_name(node))

    def imported_name(self, node: cst.CSTNode) -> Optional[str]:
        """Like ``qualified_name``, relative imports included (``.engine.fit``)."""
        dotted = dotted_name(node)
        head, _, rest = (dotted or "").partition(".")
        full = self.relative.get(head)
        if full is None:
            return self.qualify(dotted)
        return f"{full}.{rest}" if rest else full

    def candidates(self, node: cst.CSTNode) -> List[str]:
        """Where ``node`` may come from: its ``imported_name``, or, for a bare
        name no import binds, the same name in each star-imported module
        (``from models import *`` makes ``GeneratorUNet`` ``models.GeneratorUNet``)."""
        known = self.imported_name(node)
        if known is not None:
            return [known]
        if isinstance(node, cst.Name) and node.value not in self.aliases:
            return [f"{module}.{node.value}" for module in self.star_modules]
        return []

    def imports_module(self, prefix: str) -> bool:
        return any(v == prefix or v.startswith(prefix + ".") for v in self.aliases.values())


def _asname(alias: cst.ImportAlias) -> str:
    target = alias.asname.name  # type: ignore[union-attr]
    return target.value if isinstance(target, cst.Name) else dotted_name(target) or ""

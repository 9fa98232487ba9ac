"""TL201 and TL202 split one problem between them: for the same batch copy,
a pinned loader gets TL201 at the copy, an unpinned one (with workers, copied
for training) gets TL202 at the loader, and never both."""
from __future__ import annotations

import pytest

from ruletest import lint

SNIPPETS = [
    """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, batch_size=32, num_workers=4{pin})
    for x, y in loader:
        x = x.to(device)
        y = y.cuda()
        loss_fn(model(x), y).backward()
    """,
    """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, num_workers=4{pin})
    for step, batch in enumerate(loader):
        batch = {{k: v.to(device) for k, v in batch.items()}}
        model(**batch).loss.backward()
    """,
    """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, num_workers=4{pin})
    for x, y in loader:
        x = x.detach().to(device)
        model(x).sum().backward()
    """,
    """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, num_workers=4{pin})
    for batch in loader:
        moved = {{t.to(device) for t in batch}}
        optimizer.step()
    """,
    """
    from torch.utils.data import DataLoader
    loader = DataLoader(ds, num_workers=4{pin})
    it = iter(loader)
    for step in range(100):
        images, labels = next(it)
        images = images.to("cuda")
        loss = model(images, labels)
        loss.backward()
    """,
]


def _source(template: str, pin: str) -> str:
    import textwrap

    return textwrap.dedent(template.format(pin=pin)).lstrip("\n")


@pytest.mark.parametrize("template", SNIPPETS)
def test_pinned_loader_gets_tl201_only(template):
    source = _source(template, ", pin_memory=True")
    assert lint("TL201", source), "TL201 should flag the copy from a pinned loader"
    assert lint("TL202", source) == []


@pytest.mark.parametrize("pin", ["", ", pin_memory=False"])
@pytest.mark.parametrize("template", SNIPPETS)
def test_unpinned_loader_gets_tl202_only(template, pin):
    source = _source(template, pin)
    assert lint("TL201", source) == []
    found = lint("TL202", source)
    assert [d.row for d in found] == [2]

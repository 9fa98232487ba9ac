"""How long `torchlint server` takes to answer an editor, on a 2,000-line file.

    python bench/server_latency.py [--lines 2000] [--edits 20]

One run starts the server (`python -m torchlint server --preview`) as an
editor does, over stdio, with pygls's client, opens a generated training
module of about ``--lines`` lines (a loader, a training step with a sync
and a blocking copy, repeated with new names), and measures, by the wall
clock of the client:

- open: from didOpen to the first diagnostics;
- keystroke: from a didChange that types one character to the diagnostics
  of that version (this includes the server's 50 ms debounce), ``--edits``
  times, one after the other;
- burst: ten didChanges sent at once, then the time to the diagnostics of
  the last one; no diagnostics of an older version may arrive after it
  (stale lints are dropped);
- code action and hover at a finding, answered from the last lint ("fix
  all" comes without its edit, which the client resolves when the user
  picks it: that resolve is timed apart);
- the lint alone: `lint_text` on the same text in this process, for scale.

It prints the median and the max of each, in milliseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lsprotocol import types
from pygls.lsp.client import LanguageClient

BLOCK = """

def train_{n}(model, optimizer, dataset, device, epochs=1):
    loader_{n} = DataLoader(dataset, batch_size=64, pin_memory=True, num_workers=2)
    model.train()
    for epoch in range(epochs):
        total = 0.0
        for step, (images, labels) in enumerate(loader_{n}):
            images = images.to(device)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad()
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            loss.backward()
            optimizer.step()
            total += loss.item()
            if step % 100 == 0:
                print(f"epoch {{epoch}} step {{step}}: {{total / (step + 1):.4f}}")
    return total


def evaluate_{n}(model, dataset, device):
    correct = 0
    with torch.no_grad():
        for images, labels in DataLoader(dataset, batch_size=256):
            logits = model(images.to(device))
            correct += int((logits.argmax(1) == labels.to(device)).sum())
    return correct / len(dataset)
"""
HEADER = "import torch\nimport torch.nn.functional as F\nfrom torch.utils.data import DataLoader\n"


def module_of(lines: int) -> str:
    text, n = HEADER, 0
    while text.count("\n") < lines:
        text += BLOCK.format(n=n)
        n += 1
    return text


class Client(LanguageClient):
    def __init__(self) -> None:
        super().__init__("server-latency", "1")
        self.published: "asyncio.Queue[types.PublishDiagnosticsParams]" = asyncio.Queue()

        @self.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self.published.put_nowait(params)

    async def diagnostics_of(self, version: int) -> types.PublishDiagnosticsParams:
        """Wait for the diagnostics of ``version``; an older version after a newer one is an error."""
        while True:
            params = await asyncio.wait_for(self.published.get(), 120)
            if params.version is not None and params.version > version:
                raise AssertionError(f"diagnostics of version {params.version} while waiting for {version}")
            if params.version == version:
                return params


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def summary(name: str, samples) -> None:
    print(
        f"{name:<34} median {ms(statistics.median(samples)):>6} ms   max {ms(max(samples)):>6} ms   (n={len(samples)})"
    )


async def measure(lines: int, edits: int) -> None:
    text = module_of(lines)
    root = Path(tempfile.mkdtemp(prefix="torchlint-server-latency-"))
    path = root / "train.py"
    path.write_text(text)
    uri = path.as_uri()
    client = Client()
    await client.start_io(sys.executable, "-m", "torchlint", "server", "--preview")
    # As VS Code and Neovim 0.10 do: a code action's edit is asked for when the user picks it.
    resolving = types.CodeActionClientCapabilities(
        data_support=True, resolve_support=types.ClientCodeActionResolveOptions(properties=["edit"])
    )
    capabilities = types.ClientCapabilities(text_document=types.TextDocumentClientCapabilities(code_action=resolving))
    await client.initialize_async(types.InitializeParams(capabilities=capabilities, root_uri=root.as_uri()))
    client.initialized(types.InitializedParams())
    print(
        f"file: {text.count(chr(10))} lines, {len(text)} characters; python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )

    started = time.perf_counter()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    )
    first = await client.diagnostics_of(1)
    opened = time.perf_counter() - started
    summary("open -> diagnostics", [opened])
    print(f"{'':<34} {len(first.diagnostics)} findings")

    version, keystrokes = 1, []
    for _ in range(edits):
        version += 1
        at = types.Position(line=len(text.splitlines()), character=0)
        started = time.perf_counter()
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [types.TextDocumentContentChangePartial(range=types.Range(at, at), text="#")],
            )
        )
        await client.diagnostics_of(version)
        keystrokes.append(time.perf_counter() - started)
        text += "#"
    summary("keystroke -> diagnostics", keystrokes)

    started = time.perf_counter()
    for _ in range(10):
        version += 1
        at = types.Position(line=len(text.splitlines()), character=0)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                [types.TextDocumentContentChangePartial(range=types.Range(at, at), text="#")],
            )
        )
        text += "#"
    last = await client.diagnostics_of(version)
    summary("10-keystroke burst -> diagnostics", [time.perf_counter() - started])
    await asyncio.sleep(0.5)
    stale = [p.version for p in iter(client.published.get_nowait, None)] if not client.published.empty() else []
    print(f"{'':<34} stale publications after the burst: {len(stale)}")

    finding = last.diagnostics[0]
    actions, hovers = [], []
    for _ in range(edits):
        started = time.perf_counter()
        await client.text_document_code_action_async(
            types.CodeActionParams(
                types.TextDocumentIdentifier(uri), finding.range, types.CodeActionContext(diagnostics=[finding])
            )
        )
        actions.append(time.perf_counter() - started)
        started = time.perf_counter()
        await client.text_document_hover_async(
            types.HoverParams(types.TextDocumentIdentifier(uri), finding.range.start)
        )
        hovers.append(time.perf_counter() - started)
    summary("code action", actions)

    whole = types.Range(types.Position(0, 0), types.Position(len(text.splitlines()), 0))
    resolves = []
    for _ in range(3):
        [fix_all] = await client.text_document_code_action_async(
            types.CodeActionParams(
                types.TextDocumentIdentifier(uri),
                whole,
                types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.SourceFixAll]),
            )
        )
        started = time.perf_counter()
        resolved = await client.code_action_resolve_async(fix_all)
        resolves.append(time.perf_counter() - started)
        assert resolved.edit is not None
    summary("fix all, resolved when picked", resolves)
    summary("hover", hovers)

    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()

    from torchlint.cli import Settings, build_parser
    from torchlint.linter import lint_text

    options = Settings(build_parser().parse_args(["--preview"])).file_options(str(path))
    lint_text(text, str(path), options)  # warm: imports and the project facts
    alone = []
    for _ in range(5):
        started = time.perf_counter()
        lint_text(text, str(path), options)
        alone.append(time.perf_counter() - started)
    summary("lint_text alone (in process)", alone)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--edits", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(measure(args.lines, args.edits))


if __name__ == "__main__":
    main()

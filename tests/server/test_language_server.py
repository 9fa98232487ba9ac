"""`torchlint server` driven by a real LSP client over stdio (pytest-lsp).

The server runs as `python -m torchlint server --preview` in a subprocess; the
client opens a file and a notebook in a project of its own, waits for the
diagnostics the server publishes, applies code actions to the text and hovers.
"""

import asyncio
import sys
import textwrap

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = pytest.mark.asyncio

TRAIN = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, optimizer, dataset, device):
        loader = DataLoader(dataset, batch_size=32, pin_memory=True)
        for images, labels in loader:
            images = images.to(device)
            optimizer.zero_grad(set_to_none=False)
            loss = model(images).sum()
            loss.backward()
            optimizer.step()
            print(loss.item())
    """
)

WAIT_S = 120  # an upper bound on events (a loaded machine is slow), never a sleep


SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "torchlint", "server", "--preview"])


async def start_in_a_project(lsp_client: LanguageClient, tmp_path_factory, capabilities: types.ClientCapabilities):
    root = tmp_path_factory.mktemp("project")
    (root / "pyproject.toml").write_text('[tool.torchlint]\nselect = ["ALL"]\n')
    lsp_client.project = root
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities,
            root_uri=root.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name="project")],
        )
    )


@pytest_lsp.fixture(config=SERVER)
async def client(lsp_client: LanguageClient, tmp_path_factory):
    await start_in_a_project(lsp_client, tmp_path_factory, pytest_lsp.client_capabilities("visual-studio-code"))
    yield
    await lsp_client.shutdown_session()


@pytest_lsp.fixture(config=SERVER)
async def plain_client(lsp_client: LanguageClient, tmp_path_factory):
    """A client that cannot resolve a code action's edit later (no ``resolveSupport``)."""
    await start_in_a_project(lsp_client, tmp_path_factory, types.ClientCapabilities())
    yield
    await lsp_client.shutdown_session()


async def diagnostics_for(client: LanguageClient, uri: str):
    async def published():
        while uri not in client.diagnostics:
            await client.wait_for_notification(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        return client.diagnostics[uri]

    return await asyncio.wait_for(published(), WAIT_S)


async def open_file(client: LanguageClient, name: str, text: str) -> str:
    path = client.project / name
    path.write_text(text)
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text))
    )
    return uri


def apply_edits(text: str, edits) -> str:
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(position: types.Position) -> int:  # the test's text is ASCII: UTF-16 units are characters
        return starts[min(position.line, len(lines))] + position.character

    for edit in sorted(edits, key=lambda e: offset(e.range.start), reverse=True):
        text = text[: offset(edit.range.start)] + edit.new_text + text[offset(edit.range.end) :]
    return text


def by_code(diagnostics, code):
    return [d for d in diagnostics if d.code == code]


async def actions_at(client: LanguageClient, uri: str, diagnostic: types.Diagnostic, only=None):
    return await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic], only=only),
        )
    )


async def test_open_publishes_the_findings_with_the_rule_link(client: LanguageClient):
    uri = await open_file(client, "train.py", TRAIN)
    diagnostics = await diagnostics_for(client, uri)
    assert {d.code for d in diagnostics} >= {"TL101", "TL201", "TL301"}
    (sync,) = by_code(diagnostics, "TL101")
    assert sync.range.start == types.Position(line=12, character=14)  # `loss.item()`, 0-based
    assert sync.source == "torchlint" and "host-device sync" in sync.message
    assert sync.code_description.href.endswith("docs/rules.md#tl101")


async def test_a_quick_fix_gives_the_fixed_text(client: LanguageClient):
    uri = await open_file(client, "train.py", TRAIN)
    (zero_grad,) = by_code(await diagnostics_for(client, uri), "TL301")
    actions = await actions_at(client, uri, zero_grad)
    fixes = [a for a in actions if a.kind == types.CodeActionKind.QuickFix and "noqa" not in a.title]
    assert fixes, [a.title for a in actions]
    fixed = apply_edits(TRAIN, fixes[0].edit.changes[uri])
    assert "optimizer.zero_grad(set_to_none=True)" in fixed or "optimizer.zero_grad()" in fixed
    assert "unsafe" in fixes[0].title  # the author chose False: changing it is an unsafe fix
    noqa = [a for a in actions if "noqa" in a.title]
    assert noqa and apply_edits(TRAIN, noqa[0].edit.changes[uri]).splitlines()[8].endswith("# noqa: TL301")


async def test_safe_fixes_come_before_unsafe_ones_and_fix_all_fixes_the_file(client: LanguageClient):
    uri = await open_file(client, "train.py", TRAIN)
    diagnostics = await diagnostics_for(client, uri)
    (copy,) = by_code(diagnostics, "TL201")
    actions = await actions_at(client, uri, copy)
    assert actions[0].is_preferred and "unsafe" not in actions[0].title
    fixed = apply_edits(TRAIN, actions[0].edit.changes[uri])
    assert "images = images.to(device, non_blocking=True)" in fixed

    whole = types.Diagnostic(range=types.Range(types.Position(0, 0), types.Position(13, 0)), message="")
    (fix_all,) = await actions_at(client, uri, whole, only=[types.CodeActionKind.SourceFixAll])
    assert fix_all.kind == "source.fixAll.torchlint"
    # VS Code resolves an action's edit when it is picked: the menu does not wait for the fixes.
    assert fix_all.edit is None
    fix_all = await asyncio.wait_for(client.code_action_resolve_async(fix_all), WAIT_S)
    everything = apply_edits(TRAIN, fix_all.edit.changes[uri])
    assert "non_blocking=True" in everything
    assert "set_to_none=False" in everything  # an unsafe fix: fix-all applies the safe ones, as --fix does


async def test_a_client_that_cannot_resolve_gets_fix_all_with_its_edit(plain_client: LanguageClient):
    uri = await open_file(plain_client, "train.py", TRAIN)
    await diagnostics_for(plain_client, uri)
    whole = types.Diagnostic(range=types.Range(types.Position(0, 0), types.Position(13, 0)), message="")
    (fix_all,) = await actions_at(plain_client, uri, whole, only=[types.CodeActionKind.SourceFixAll])
    assert "non_blocking=True" in apply_edits(TRAIN, fix_all.edit.changes[uri])


async def test_a_change_is_linted_again(client: LanguageClient):
    uri = await open_file(client, "train.py", TRAIN)
    await diagnostics_for(client, uri)
    del client.diagnostics[uri]
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangeWholeDocument(text=TRAIN.replace("print(loss.item())", "pass"))
            ],
        )
    )
    diagnostics = await diagnostics_for(client, uri)
    assert not by_code(diagnostics, "TL101") and by_code(diagnostics, "TL201")


async def test_hover_shows_the_rule_documentation(client: LanguageClient):
    uri = await open_file(client, "train.py", TRAIN.replace("print(loss.item())", "print(loss.item())  # noqa: TL101"))
    await diagnostics_for(client, uri)
    on_finding = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(uri), types.Position(line=7, character=22))
    )
    assert "blocking-host-to-device-copy (TL201)" in on_finding.contents.value
    on_noqa = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(uri), types.Position(line=12, character=40))
    )
    assert "host-sync-in-loop (TL101)" in on_noqa.contents.value
    nothing = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(uri), types.Position(line=0, character=1))
    )
    assert nothing is None


async def test_a_notebook_is_linted_cell_by_cell(client: LanguageClient):
    notebook_uri = (client.project / "explore.ipynb").as_uri()
    cells = [
        "%matplotlib inline\nimport torch\nfrom torch.utils.data import DataLoader",
        "# notes, not code",
        "loader = DataLoader(range(10), pin_memory=True)\nfor x in loader:\n    x = x.to('cuda:0')\n    print(x.sum().item())",
    ]
    kinds = [types.NotebookCellKind.Code, types.NotebookCellKind.Markup, types.NotebookCellKind.Code]
    cell_uris = [f"vscode-notebook-cell:{client.project / 'explore.ipynb'}#cell{i}" for i in range(len(cells))]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook_uri,
                notebook_type="jupyter-notebook",
                version=1,
                cells=[types.NotebookCell(kind=kind, document=uri) for kind, uri in zip(kinds, cell_uris)],
            ),
            cell_text_documents=[
                types.TextDocumentItem(
                    uri=uri,
                    language_id="python" if kind == types.NotebookCellKind.Code else "markdown",
                    version=1,
                    text=text,
                )
                for uri, kind, text in zip(cell_uris, kinds, cells)
            ],
        )
    )
    last = await diagnostics_for(client, cell_uris[2])
    first = await diagnostics_for(client, cell_uris[0])
    assert list(first) == []  # the magic is not a syntax error
    (sync,) = by_code(last, "TL101")
    assert sync.range.start.line == 3  # the cell's own line, not the joined source's
    (copy,) = by_code(last, "TL201")
    actions = await actions_at(client, cell_uris[2], copy)
    fixed = apply_edits(cells[2], actions[0].edit.changes[cell_uris[2]])
    assert "x = x.to('cuda:0', non_blocking=True)" in fixed

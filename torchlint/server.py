"""`torchlint server`: the linter as a language server over stdio (pygls and lsprotocol).

- Diagnostics on open, change and save, with the configuration the command
  line would use for the file (its nearest `[tool.torchlint]`; `--preview`,
  `--config` and `--isolated` as for `torchlint check`). Each carries the
  rule's documentation link (`codeDescription`).
- Code actions: each finding's fix (safe ones first; unsafe ones say so),
  "add `# noqa: TLnnn`", and "fix all" (`source.fixAll.torchlint`: the fixes
  `--fix` would apply, with `--unsafe-fixes` where the config asks for them).
- Hover over a finding, or over a code in a `# noqa` comment: the rule's documentation.
- Notebooks through the protocol's notebook documents: the code cells are
  linted as one source (`torchlint.notebook_cells`) and findings go to their cells.

Linting runs on a worker thread so that the server keeps reading messages.
A change waits `DEBOUNCE_S` for the next keystroke, and a lint whose document
changed meanwhile is dropped, never published. The module never imports torch.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument
from pygls.workspace.position_codec import ServerTextPosition, ServerTextRange

from torchlint import __version__, docs
from torchlint.fixer import fix_text, is_applicable
from torchlint.incremental import ChunkedParser
from torchlint.linter import FileOptions, LintOutput, lint_text, parse_module
from torchlint.notebook_cells import Cell, ConcatenatedCells, concatenate
from torchlint.registry import all_rules
from torchlint.rule import DOCS_URL, UNSAFE, Diagnostic, ResolvedEdit
from torchlint.runner import with_noqa

DEBOUNCE_S = 0.05  # a burst of keystrokes is linted once, after the last
SOURCE = "torchlint"
FIX_ALL_KIND = f"{types.CodeActionKind.SourceFixAll.value}.torchlint"
_CODE_AT = re.compile(r"\bTL\d{3}\b")

log = logging.getLogger(__name__)


@dataclass
class Linted:
    """The last lint of one document (a text file, or a notebook's cells joined)."""

    version: Tuple[int, ...]
    text: str
    findings: List[Diagnostic]
    cells: Optional[ConcatenatedCells] = None


class TorchlintServer(LanguageServer):
    def __init__(self, cli_args: Sequence[str], settings_from: Callable[[Sequence[str]], Any]) -> None:
        super().__init__(
            SOURCE,
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        cells=[types.NotebookCellLanguage(language="python")], notebook="*"
                    )
                ],
                save=True,
            ),
        )
        # the command line's own resolution of settings (``cli.settings_from``),
        # handed in by the command line: the server does not import it back
        self.settings = settings_from(cli_args)
        self.linted: Dict[str, Linted] = {}  # text document or notebook uri -> its last lint
        self.pending: Dict[str, asyncio.Task] = {}
        # text document or notebook uri -> the parser that keeps the pieces of its last text
        self.parsers: Dict[str, ChunkedParser] = {}
        self.warned_no_rules = False

    # -- what to lint ----------------------------------------------------------------------

    def path_of(self, uri: str) -> str:
        path = to_fs_path(uri)
        if path and uri.startswith("file:"):
            return path
        root = self.workspace.root_path or os.getcwd()
        return os.path.join(root, "untitled.py")  # an unsaved buffer takes the workspace's configuration

    def options_for(self, path: str) -> FileOptions:
        options = self.settings.file_options(path)
        if not options.rules and not self.warned_no_rules:
            self.warned_no_rules = True
            self.window_show_message(
                types.ShowMessageParams(
                    types.MessageType.Warning,
                    "torchlint: no rule is enabled for this file. Every rule is in preview for now: "
                    "start the server as `torchlint server --preview`, or set `preview = true` under [tool.torchlint].",
                )
            )
        return options

    def snapshot(self, uri: str) -> Tuple[Tuple[int, ...], str, Optional[ConcatenatedCells]]:
        """The document's version, its Python source, and, for a notebook, how its cells were joined."""
        notebook = self.workspace.get_notebook_document(notebook_uri=uri)
        if notebook is None:
            document = self.workspace.get_text_document(uri)
            return (document.version or 0,), document.source, None
        cells = [
            self.workspace.get_text_document(cell.document)
            for cell in notebook.cells
            if cell.kind == types.NotebookCellKind.Code
        ]
        joined = concatenate([Cell(cell.uri, cell.source) for cell in cells if cell.language_id == "python"])
        version = (notebook.version, *(cell.version or 0 for cell in cells))
        return version, joined.source, joined

    # -- linting ---------------------------------------------------------------------------

    def schedule(self, uri: str, debounce: bool) -> None:
        previous = self.pending.pop(uri, None)
        if previous is not None:
            previous.cancel()
        self.pending[uri] = asyncio.ensure_future(self.lint_and_publish(uri, DEBOUNCE_S if debounce else 0.0))

    async def lint_and_publish(self, uri: str, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        linted = await self.lint(uri)
        if linted is None or self.snapshot(uri)[0] != linted.version:
            return  # the document changed while it was linted: the newer lint publishes
        self.publish(uri, linted)

    async def lint(self, uri: str) -> Optional[Linted]:
        version, text, cells = self.snapshot(uri)
        path = self.path_of(uri if cells is None else uri.rsplit(".", 1)[0] + ".py")
        options = self.options_for(path)
        parser = self.parsers.setdefault(uri, ChunkedParser(parse_module))
        output = await asyncio.get_running_loop().run_in_executor(None, self.lint_with, parser, text, path, options)
        for error in output.errors:
            log.error("%s", error)
        linted = Linted(version, text, output.diagnostics, cells)
        self.linted[uri] = linted
        return linted

    async def current(self, uri: str) -> Optional[Linted]:
        """The lint of the document as it is now (linting it again if it changed)."""
        owner = self.owner_of(uri)
        linted = self.linted.get(owner)
        if linted is not None and linted.version == self.snapshot(owner)[0]:
            return linted
        return await self.lint(owner)

    @staticmethod
    def lint_with(parser: ChunkedParser, text: str, path: str, options: FileOptions) -> LintOutput:
        """One lint at a time per document: its parser keeps the pieces of the text it saw last."""
        with parser.lock:
            return lint_text(text, path, options, parser=parser)

    def owner_of(self, uri: str) -> str:
        """The notebook a cell belongs to, else the uri itself."""
        notebook = self.workspace.get_notebook_document(cell_uri=uri)
        return notebook.uri if notebook is not None else uri

    def publish(self, uri: str, linted: Linted) -> None:
        if linted.cells is None:
            document = self.workspace.get_text_document(uri)
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(
                    uri, [to_lsp(d, document) for d in linted.findings], version=linted.version[0]
                )
            )
            return
        by_cell: Dict[str, List[types.Diagnostic]] = {span.uri: [] for span in linted.cells.spans}
        for finding in linted.findings:
            placed = in_cell(finding, linted.cells)
            if placed is not None:
                cell_uri, local = placed
                by_cell[cell_uri].append(to_lsp(local, self.workspace.get_text_document(cell_uri)))
        for cell_uri, diagnostics in by_cell.items():
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(cell_uri, diagnostics))

    def forget(self, uri: str, cell_uris: Sequence[str] = ()) -> None:
        task = self.pending.pop(uri, None)
        if task is not None:
            task.cancel()
        self.linted.pop(uri, None)
        self.parsers.pop(uri, None)
        for target in cell_uris or [uri]:
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(target, []))

    # -- code actions ----------------------------------------------------------------------

    async def code_actions(self, params: types.CodeActionParams) -> List[types.CodeAction]:
        uri = params.text_document.uri
        linted = await self.current(uri)
        if linted is None:
            return []
        document = self.workspace.get_text_document(uri)
        wanted = document.range_from_client_units(params.range)
        here = []
        for finding in linted.findings:
            local = finding if linted.cells is None else _local_in(finding, linted.cells, uri)
            if local is not None and _overlaps(local, wanted):
                here.append(local)
        fixes, noqa = [], []
        if not _kind_wanted(params, types.CodeActionKind.QuickFix.value):
            here = []
        for d in here:
            diagnostic = to_lsp(d, document)
            if d.fix is not None and is_applicable(d.fix, unsafe_fixes=True):
                unsafe = d.fix.applicability == UNSAFE
                title = f"{d.code}: {d.fix.message}" + (" (unsafe fix: may change behaviour)" if unsafe else "")
                edits = [text_edit(e, document) for e in d.fix.edits]
                fixes.append(
                    (
                        unsafe,
                        types.CodeAction(
                            title,
                            kind=types.CodeActionKind.QuickFix,
                            diagnostics=[diagnostic],
                            is_preferred=not unsafe,
                            edit=types.WorkspaceEdit(changes={uri: edits}),
                        ),
                    )
                )
            if d.code != "TL000":
                noqa.append(self.noqa_action(d, document, diagnostic))
        actions = [action for _, action in sorted(fixes, key=lambda item: item[0])]  # safe first
        actions += [action for action in noqa if action is not None]
        if linted.cells is None and _kind_wanted(params, FIX_ALL_KIND):
            if self.resolves_edits():
                fix_all = self.fix_all_stub(uri, linted)
            else:
                fix_all = await self.fix_all_action(uri, linted, document)
            if fix_all is not None:
                actions.append(fix_all)
        return actions

    def resolves_edits(self) -> bool:
        """The client asks for a code action's edit when the user picks it (codeAction/resolve)."""
        try:
            support = self.client_capabilities.text_document.code_action.resolve_support  # type: ignore[union-attr]
        except AttributeError:
            return False
        return support is not None and "edit" in (support.properties or [])

    def fix_all_stub(self, uri: str, linted: Linted) -> Optional[types.CodeAction]:
        """The "fix all" action without its edit: fixing the file lints it again, a few times, which a menu
        that opens on every cursor move cannot wait for. The edit comes in ``resolve_fix_all``."""
        unsafe = self.settings.unsafe_fixes(self.settings.config_for(self.path_of(uri)))
        if not any(is_applicable(d.fix, unsafe) for d in linted.findings):
            return None
        return types.CodeAction(self.fix_all_title(unsafe), kind=FIX_ALL_KIND, data={"uri": uri})

    @staticmethod
    def fix_all_title(unsafe: bool) -> str:
        return "torchlint: fix all" + (" (safe and unsafe fixes)" if unsafe else " safe fixes")

    async def resolve_fix_all(self, action: types.CodeAction) -> types.CodeAction:
        """The edit of a "fix all" the user picked, for the document as it is now."""
        uri = (action.data or {}).get("uri") if isinstance(action.data, dict) else None
        linted = await self.current(uri) if uri else None
        if uri is None or linted is None or linted.cells is not None:
            return action
        resolved = await self.fix_all_action(uri, linted, self.workspace.get_text_document(uri))
        if resolved is None:  # nothing left to fix: an empty edit, so the client applies nothing
            action.edit = types.WorkspaceEdit(changes={uri: []})
            return action
        action.edit = resolved.edit
        return action

    def noqa_action(
        self, d: Diagnostic, document: TextDocument, diagnostic: types.Diagnostic
    ) -> Optional[types.CodeAction]:
        """The edit of `torchlint --add-noqa` for this finding, on its noqa line alone. (The
        command line also parses the result, against a line inside a multi-line string; the
        engine's noqa row is a statement's line, and a keystroke's budget has no room for a parse.)"""
        row = d.noqa_row or d.row
        if row > len(document.lines):
            return None
        old_line = document.lines[row - 1].rstrip("\r\n")
        new_line = with_noqa(old_line, [d.code])
        if new_line is None:
            return None
        end = document.position_to_client_units(ServerTextPosition(row - 1, len(old_line)))
        edit = types.TextEdit(types.Range(types.Position(row - 1, 0), end), new_line)
        return types.CodeAction(
            f"{d.code}: add `# noqa: {d.code}`",
            kind=types.CodeActionKind.QuickFix,
            diagnostics=[diagnostic],
            edit=types.WorkspaceEdit(changes={document.uri: [edit]}),
        )

    async def fix_all_action(self, uri: str, linted: Linted, document: TextDocument) -> Optional[types.CodeAction]:
        path = self.path_of(uri)
        config = self.settings.config_for(path)
        unsafe = self.settings.unsafe_fixes(config)
        if not any(is_applicable(d.fix, unsafe) for d in linted.findings):
            return None
        allowed = self.settings.fixable(config)
        result = await asyncio.get_running_loop().run_in_executor(
            None,
            fix_text,
            linted.text,
            path,
            self.options_for(path),
            unsafe,
            (lambda code: code in allowed) if allowed is not None else (lambda code: True),
        )
        if result.error is not None or result.text == linted.text:
            return None
        whole = types.Range(types.Position(0, 0), types.Position(len(document.lines), 0))
        return types.CodeAction(
            self.fix_all_title(unsafe),
            kind=FIX_ALL_KIND,
            edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(whole, result.text)]}),
        )

    # -- hover -----------------------------------------------------------------------------

    async def hover(self, params: types.HoverParams) -> Optional[types.Hover]:
        uri = params.text_document.uri
        document = self.workspace.get_text_document(uri)
        at = document.position_from_client_units(params.position)
        codes = []
        line = document.lines[at.line] if at.line < len(document.lines) else ""
        for match in _CODE_AT.finditer(line):  # a code in a suppression comment
            if match.start() <= at.character <= match.end() and "#" in line[: match.start()]:
                codes.append(match.group(0))
        if not codes:
            linted = await self.current(uri)
            cells = linted.cells if linted is not None else None
            for finding in linted.findings if linted is not None else []:
                local = finding if cells is None else _local_in(finding, cells, uri)
                if local is not None and _overlaps(local, ServerTextRange(at, at)):
                    codes.append(local.code)
        rules = all_rules()
        pages = [
            docs.render_markdown(rules[code]) + f"\n[Documentation]({_url(code)})"
            for code in dict.fromkeys(codes)
            if code in rules
        ]
        if not pages:
            return None
        return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, "\n\n---\n\n".join(pages)))


# -- conversions between the linter's positions and the protocol's ----------------------


def to_lsp(d: Diagnostic, document: TextDocument) -> types.Diagnostic:
    """A finding as a protocol diagnostic; the linter's columns are 1-based code points."""
    server_range = ServerTextRange(
        ServerTextPosition(d.row - 1, d.column - 1), ServerTextPosition(d.end_row - 1, d.end_column - 1)
    )
    return types.Diagnostic(
        range=document.range_to_client_units(server_range),
        message=d.message,
        severity=types.DiagnosticSeverity.Error if d.code == "TL000" else types.DiagnosticSeverity.Warning,
        code=d.code,
        code_description=types.CodeDescription(href=_url(d.code)),
        source=SOURCE,
    )


def text_edit(edit: ResolvedEdit, document: TextDocument) -> types.TextEdit:
    """An edit as a protocol text edit; the linter's edit columns are 0-based code points."""
    server_range = ServerTextRange(
        ServerTextPosition(edit.start[0] - 1, edit.start[1]), ServerTextPosition(edit.end[0] - 1, edit.end[1])
    )
    return types.TextEdit(document.range_to_client_units(server_range), edit.content)


def in_cell(d: Diagnostic, cells: ConcatenatedCells) -> Optional[Tuple[str, Diagnostic]]:
    """The cell a finding of the joined source is in, and the finding placed in that cell.
    A fix with an edit outside the cell is dropped (the finding stays)."""
    start, end = cells.locate(d.row), cells.locate(d.end_row)
    if start is None:
        return None
    cell_uri, row = start
    offset = d.row - row
    end_row, end_column = (end[1], d.end_column) if end is not None and end[0] == cell_uri else (row, d.column)
    fix = d.fix
    if fix is not None:
        edits: List[ResolvedEdit] = []
        for edit in fix.edits:
            first, last = cells.locate(edit.start[0]), cells.locate(edit.end[0])
            if first is None or last is None or first[0] != cell_uri or last[0] != cell_uri:
                edits = []
                break
            edits.append(
                ResolvedEdit(edit.content, (edit.start[0] - offset, edit.start[1]), (edit.end[0] - offset, edit.end[1]))
            )
        fix = type(fix)(fix.applicability, fix.message, tuple(edits)) if edits else None
    noqa_row = (d.noqa_row or d.row) - offset
    local = Diagnostic(
        d.code,
        d.name,
        d.message,
        d.path,
        row,
        d.column,
        end_row,
        end_column,
        fix,
        noqa_row if noqa_row >= 1 else row,
        d.evidence,
    )
    return cell_uri, local


def _local_in(d: Diagnostic, cells: ConcatenatedCells, cell_uri: str) -> Optional[Diagnostic]:
    placed = in_cell(d, cells)
    return placed[1] if placed is not None and placed[0] == cell_uri else None


def _overlaps(d: Diagnostic, wanted: ServerTextRange) -> bool:
    start = ServerTextPosition(d.row - 1, d.column - 1)
    end = ServerTextPosition(d.end_row - 1, d.end_column - 1)
    return start <= wanted.end and wanted.start <= end


def _kind_wanted(params: types.CodeActionParams, kind: str) -> bool:
    only = params.context.only
    return not only or any(kind == wanted or kind.startswith(f"{wanted}.") for wanted in only)


def _url(code: str) -> str:
    return f"{DOCS_URL}#{code.lower()}"


# -- wiring ----------------------------------------------------------------------------------


def build_server(cli_args: Sequence[str], settings_from: Callable[[Sequence[str]], Any]) -> TorchlintServer:
    server = TorchlintServer(cli_args, settings_from)

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TorchlintServer, params: types.DidOpenTextDocumentParams) -> None:
        if ls.workspace.get_notebook_document(cell_uri=params.text_document.uri) is None:
            ls.schedule(params.text_document.uri, debounce=False)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TorchlintServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(ls.owner_of(params.text_document.uri), debounce=True)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TorchlintServer, params: types.DidSaveTextDocumentParams) -> None:
        ls.schedule(ls.owner_of(params.text_document.uri), debounce=False)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TorchlintServer, params: types.DidCloseTextDocumentParams) -> None:
        if ls.workspace.get_notebook_document(cell_uri=params.text_document.uri) is None:
            ls.forget(params.text_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
    def notebook_open(ls: TorchlintServer, params: types.DidOpenNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, debounce=False)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def notebook_change(ls: TorchlintServer, params: types.DidChangeNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, debounce=True)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
    def notebook_save(ls: TorchlintServer, params: types.DidSaveNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, debounce=False)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
    def notebook_close(ls: TorchlintServer, params: types.DidCloseNotebookDocumentParams) -> None:
        ls.forget(params.notebook_document.uri, [cell.uri for cell in params.cell_text_documents])

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND], resolve_provider=True),
    )
    async def code_action(ls: TorchlintServer, params: types.CodeActionParams) -> List[types.CodeAction]:
        return await ls.code_actions(params)

    @server.feature(types.CODE_ACTION_RESOLVE)
    async def code_action_resolve(ls: TorchlintServer, action: types.CodeAction) -> types.CodeAction:
        return await ls.resolve_fix_all(action)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: TorchlintServer, params: types.HoverParams) -> Optional[types.Hover]:
        return await ls.hover(params)

    return server


def main(argv: Optional[Sequence[str]], settings_from: Callable[[Sequence[str]], Any]) -> int:
    """``torchlint server``: ``settings_from(cli_args)`` resolves settings as ``torchlint check`` does."""
    parser = argparse.ArgumentParser(
        prog="torchlint server", description="Run torchlint as a language server over stdio (for editors)."
    )
    parser.add_argument("--preview", action="store_true", default=None, help="also run preview rules")
    parser.add_argument("--no-preview", dest="preview", action="store_false")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="PATH|KEY=VALUE",
        help="a config file, or a TOML `key = value` override, as for `torchlint check`",
    )
    parser.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    args = parser.parse_args(argv)
    cli_args = [
        *(["--preview"] if args.preview else ["--no-preview"] if args.preview is False else []),
        *(f"--config={entry}" for entry in args.config),
        *(["--isolated"] if args.isolated else []),
    ]
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="torchlint server: %(message)s")
    build_server(cli_args, settings_from).start_io()
    return 0

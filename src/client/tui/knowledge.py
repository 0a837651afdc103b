"""The Knowledge panel: the documents the user can see (name, size, chunks, collection, uploaded at)
with upload (a path input that completes file names, a progress bar per file: bytes, then the
server's stages), download and delete (asks first)."""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Static

from protocol.kb import KbDocument

from client.tui.modals import ConfirmModal
from client.wording import counted, minute

Progress = Callable[[str, int, int], None]     # (stage, done, total), as client.kb reports it


@dataclass(frozen=True, slots=True)
class KnowledgeOps:
    """What the panel may do (the app binds them to its client)."""
    list: Callable[[], Awaitable[Sequence[KbDocument]]]
    upload: Callable[[Path, Progress], Awaitable[KbDocument]]
    download: Callable[[KbDocument, Path], Awaitable[KbDocument]]
    delete: Callable[[str], Awaitable[object]]
    folder: Path                                # where downloads go


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def complete_path(value: str) -> str | None:
    """The first file or folder name completing ``value`` (a folder gets a trailing slash); blocking."""
    if not value:
        return None
    expanded = os.path.expanduser(value)
    folder, prefix = os.path.split(expanded)
    try:
        names = sorted(os.listdir(folder or "."))
    except OSError:
        return None
    for name in names:
        if name.startswith(prefix) and name != prefix and not (name.startswith(".") and not prefix.startswith(".")):
            tail = name[len(prefix):]
            if os.path.isdir(os.path.join(folder or ".", name)):
                tail += os.sep
            return value + tail
    return None


class PathSuggester(Suggester):
    """Completes file names (Tab or Right accepts), listing folders off the event loop."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        return await asyncio.to_thread(complete_path, value)


class Transfer(Vertical):
    """One file's upload: its name and stage, and a bar (bytes while receiving, then stage done/total)."""

    def __init__(self, path: Path, *, waiting: bool = False) -> None:
        super().__init__(classes="kb-transfer")
        self.path = path
        self.stage = "waiting for the upload before it" if waiting else "hashing"
        self.stages: list[str] = []      # every stage reported, in order

    def compose(self) -> ComposeResult:
        yield Label(f"{self.path.name} · {self.stage}", classes="kb-transfer-title")
        yield ProgressBar(total=None, show_eta=False, classes="kb-transfer-bar")

    def progress(self, stage: str, done: int, total: int) -> None:
        bar = self.query_one(ProgressBar)
        if stage != self.stage or not self.stages:
            self.stage = stage
            self.stages.append(stage)
            bar.update(total=total if total > 0 else None, progress=0)
        label = f"{self.path.name} · {stage}"
        if stage == "receiving" and total > 0:
            label += f" {human_size(done)} of {human_size(total)}"
        elif total > 0:
            label += f" {done}/{total}"
        self.query_one(Label).update(label)
        bar.update(total=total if total > 0 else None, progress=done)

    def finish(self, text: str, error: bool = False) -> None:
        self.query_one(Label).update(Text(f"{self.path.name} · {text}", style="red" if error else ""))
        bar = self.query_one(ProgressBar)
        if not error:
            bar.update(total=1, progress=1)


class KnowledgeScreen(ModalScreen[None]):
    """U uploads (focuses the path input), D downloads the highlighted document, Delete deletes it."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False),
                Binding("u", "upload", "Upload", show=False),
                Binding("d", "download", "Download", show=False),
                Binding("delete", "delete", "Delete", show=False)]

    def __init__(self, ops: KnowledgeOps, *, upload_first: bool = False) -> None:
        super().__init__(classes="modal")
        self.ops = ops
        self.upload_first = upload_first
        self.documents: list[KbDocument] = []
        self.loaded = False
        self.transfers: dict[Path, Transfer] = {}
        # one upload at a time: client.kb taps KB_PROGRESS for one upload, and the bytes share one link anyway
        self._one_upload = asyncio.Lock()

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide knowledge"):
            yield Label("Knowledge base", classes="dialog-title")
            yield Static("", id="kb-info")
            yield DataTable(id="kb-table", cursor_type="row", zebra_stripes=True)
            yield Input(placeholder="file to upload (→ accepts the completion), Enter uploads", id="kb-path",
                        suggester=PathSuggester())
            yield VerticalScroll(id="kb-transfers")
            with Horizontal(classes="buttons"):
                yield Button("Upload", variant="primary", id="kb-upload")
                yield Button("Download", id="kb-download")
                yield Button("Delete", variant="error", id="kb-delete")
                yield Button("Close", id="kb-close")

    def on_mount(self) -> None:
        table = self.query_one("#kb-table", DataTable)
        table.add_columns("Name", "Size", "Chunks", "Collection", "Uploaded at")
        if self.upload_first:
            self.query_one("#kb-path", Input).focus()
        self.refresh_list()

    @work(exclusive=True, group="kb-list")
    async def refresh_list(self) -> None:
        info = self.query_one("#kb-info", Static)
        try:
            self.documents = list(await self.ops.list())
        except Exception as exc:  # noqa: BLE001 - shown to the user, the panel stays usable
            info.update(Text(f"Cannot list the documents: {exc}", style="red"))
            return
        table = self.query_one("#kb-table", DataTable)
        table.clear()
        for doc in self.documents:
            table.add_row(doc.name, human_size(doc.size), str(doc.chunks), doc.collection,
                          minute(doc.uploaded_at), key=doc.doc_id)
        n = len(self.documents)
        info.update("No documents yet: upload one (U)" if not n else counted(n, "document"))
        self.loaded = True

    @property
    def selected(self) -> KbDocument | None:
        table = self.query_one("#kb-table", DataTable)
        row = table.cursor_row
        return self.documents[row] if self.documents and 0 <= row < len(self.documents) else None

    # -- upload -----------------------------------------------------------------------------------------
    def action_upload(self) -> None:
        box = self.query_one("#kb-path", Input)
        if box.has_focus and box.value.strip():
            self._start_upload(box.value.strip())
        else:
            box.focus()

    @on(Input.Submitted, "#kb-path")
    def _submitted(self, event: Input.Submitted) -> None:
        if event.value.strip():
            self._start_upload(event.value.strip())

    def _start_upload(self, value: str) -> None:
        path = Path(value).expanduser()
        if not path.is_file():
            self.notify(f"Not a file: {value}", severity="error")
            return
        self.query_one("#kb-path", Input).value = ""
        self._upload(path)

    @work(group="kb-upload")
    async def _upload(self, path: Path) -> None:
        row = Transfer(path, waiting=self._one_upload.locked())
        self.transfers[path] = row
        await self.query_one("#kb-transfers", VerticalScroll).mount(row)
        try:
            async with self._one_upload:
                doc = await self.ops.upload(path, row.progress)
        except Exception as exc:  # noqa: BLE001 - shown on the file's row
            row.finish(f"failed: {exc}", error=True)
            return
        note = "already there (duplicate)" if doc.duplicate else counted(doc.chunks, "chunk")
        row.finish(f"done, {note}")
        self.refresh_list()

    # -- download, delete -------------------------------------------------------------------------------
    def action_download(self) -> None:
        doc = self.selected
        if doc is not None:
            self._download(doc)

    @work(group="kb-download")
    async def _download(self, doc: KbDocument) -> None:
        dest = self.ops.folder / (Path(doc.name).name or doc.doc_id)   # never a path from the server
        try:
            await self.ops.download(doc, dest)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.notify(f"Download failed: {exc}", severity="error")
            return
        self.notify(f"Downloaded to {dest}")

    def action_delete(self) -> None:
        doc = self.selected
        if doc is None:
            return

        def done(ok: bool | None) -> None:
            if ok:
                self._delete(doc)
        self.app.push_screen(ConfirmModal(f"Delete document “{doc.name}” from the knowledge base? Its passages "
                                          "are no longer found or cited.", "Delete"), done)

    @work(group="kb-delete")
    async def _delete(self, doc: KbDocument) -> None:
        try:
            await self.ops.delete(doc.doc_id)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.notify(f"Delete failed: {exc}", severity="error")
            return
        self.notify(f"Deleted “{doc.name}”")
        self.refresh_list()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        match event.button.id:
            case "kb-upload":
                self.action_upload()
            case "kb-download":
                self.action_download()
            case "kb-delete":
                self.action_delete()
            case _:
                self.dismiss(None)

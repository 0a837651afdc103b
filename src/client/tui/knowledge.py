"""The Knowledge panel: the documents the user can see (name, size, chunks, collection, uploaded at)
with upload (a path input that completes file names, a progress bar per file: bytes, then the
server's stages; each cancellable), download (asks before replacing a file; one download at a time:
a second one waits for the one before it) and delete (asks first; in a group, a document another
member uploaded too is not removed but stays theirs, only the caller's upload withdrawn: the notice
says so, from the reply's ``kept_for``).

Downloads belong to the panel: closing it stops the running and waiting ones, each notified (the
part file stays: ``d`` on the document later resumes it).

Uploads belong to the app (``Uploads``), not to the panel: they go on when it closes, a panel opened
later shows the ones still running, and one that ends while no panel shows it is notified."""
from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Sequence

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.suggester import Suggester
from textual.widgets import Button, DataTable, Input, Label, ProgressBar, Static
from textual.worker import Worker

from protocol.kb import KbDeleteReply, KbDocument

from client.kb_cli import local_name
from client.tui.modals import ConfirmModal
from client.wording import counted, minute, printable

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]     # (stage, done, total), as client.kb reports it
UploadFn = Callable[[Path, Progress], Awaitable[KbDocument]]
WAITING = "waiting for the upload before it"
DOWNLOAD_WAITING = "waits for the download before it"
DOWNLOAD_STOPPED = "stopped: press d on it in the knowledge panel to resume"
SENDING_STAGES = frozenset({"hashing", WAITING, "receiving"})   # before the server has every byte
GROUP_PREFIX = "group:"   # a group's collection (docs/knowledge.md "Collections and isolation")
#: the widest a document's name is shown in the panel's table (terminal cells; longer names are cut
#: with "…"): a name of hundreds of characters would otherwise push the other columns out of view
NAME_MAX_CELLS = 40


@dataclass(eq=False)
class UploadJob:
    """One file's upload: where it is (``stage``, ``done`` of ``total``), how it ended (``end``)."""
    path: Path
    stage: str = "hashing"
    done: int = 0
    total: int = 0
    stages: list[str] = field(default_factory=list)   # every stage reported, in order
    end: str | None = None              # how it ended, in words ("done, 3 chunks", "failed: ...")
    failed: bool = False
    cancelling: bool = False            # the user cancelled it
    worker: Worker[None] | None = None
    watch: Callable[[UploadJob], None] | None = None   # the open panel showing it, told of every change

    @property
    def running(self) -> bool:
        return self.end is None

    def progress(self, stage: str, done: int, total: int) -> None:
        """What client.kb reports (receiving bytes, then the server's stages)."""
        if stage != self.stage or not self.stages:
            self.stages.append(stage)
        self.stage, self.done, self.total = stage, done, total
        self.changed()

    def changed(self) -> None:
        """Tell the panel showing the job. Progress comes from the client's reader task (client.kb's
        tap), which must never fail: a panel that cannot show it any more just stops watching."""
        if self.watch is not None:
            try:
                self.watch(self)
            except Exception:  # noqa: BLE001 - a closing panel's widgets are gone; the upload goes on
                log.exception("the knowledge panel could not show the upload of %s", self.path.name)
                self.watch = None


class Uploads:
    """The app's knowledge-base uploads, one at a time (their bytes share one link: one after the
    other, each shows its own progress from the start). Each runs as an app worker, so closing the
    panel does not stop it; ``cancel`` does. An upload that ends while no panel shows it is notified (done with its
    chunks, refused with the reason, cancelled)."""

    def __init__(self, upload: UploadFn) -> None:
        self.upload = upload
        self.jobs: list[UploadJob] = []     # not ended yet, in order
        self._one = asyncio.Lock()

    def start(self, app: App[object], path: Path) -> UploadJob:
        job = UploadJob(path, stage=WAITING if self.jobs else "hashing")
        self.jobs.append(job)
        job.worker = app.run_worker(self._run(app, job), name=f"upload {path.name}", group="kb-upload",
                                    exit_on_error=False)
        return job

    def cancel(self, job: UploadJob) -> None:
        if job.running and job.worker is not None:
            job.cancelling = True
            job.worker.cancel()

    async def _run(self, app: App[object], job: UploadJob) -> None:
        try:
            async with self._one:
                job.stage = "hashing"
                job.changed()
                doc = await self.upload(job.path, job.progress)
        except asyncio.CancelledError:
            if job.cancelling:   # else the app is closing: nobody to tell
                self._ended(app, job, cancelled_text(job.stage), failed=True)
            raise
        except Exception as exc:  # noqa: BLE001 - a refusal (UNSUPPORTED_MEDIA, ...) or a lost file: told
            self._ended(app, job, f"failed: {exc}", failed=True)
        else:
            self._ended(app, job, "done, " + ("already there (duplicate)" if doc.duplicate
                                              else counted(doc.chunks, "chunk")))

    def _ended(self, app: App[object], job: UploadJob, text: str, *, failed: bool = False) -> None:
        job.end, job.failed = text, failed
        if job in self.jobs:
            self.jobs.remove(job)
        job.changed()
        if job.watch is None:   # the panel was closed meanwhile
            app.notify(f"Upload of {job.path.name}: {text}", title="Knowledge base",
                       severity="error" if failed and not job.cancelling else "information", timeout=10)


def cancelled_text(stage: str) -> str:
    """What a cancelled upload left behind, by the last stage the server reported."""
    if stage == WAITING:
        return "cancelled (nothing was sent)"
    if stage in SENDING_STAGES:
        return "cancelled (the server keeps what it received for a while: uploading the file again continues it)"
    return "cancelled here, but the server already had the whole file and may still add it to the list"


@dataclass(frozen=True, slots=True)
class KnowledgeOps:
    """What the panel may do (the app binds them to its client); ``uploads``: the app's uploads
    (None: the panel keeps its own, made from ``upload``)."""
    list: Callable[[], Awaitable[Sequence[KbDocument]]]
    upload: UploadFn
    download: Callable[[KbDocument, Path], Awaitable[KbDocument]]
    delete: Callable[[str], Awaitable[KbDeleteReply | None]]   # the reply: its ``kept_for`` is read
    folder: Path                                # where downloads go
    uploads: Uploads | None = None


def delete_question(doc: KbDocument) -> str:
    """The delete confirmation. In a group, one uploader's delete does not remove a document that
    other members uploaded too (the same bytes): it stays theirs (docs/protocol.md §5.8, KB_DELETE)."""
    question = f"Delete document “{doc.name}” from the knowledge base? Its passages are no longer found or cited"
    if doc.collection.startswith(GROUP_PREFIX):
        return (f"{question}, unless another member of {doc.collection} uploaded the same bytes: then it stays "
                "theirs, and only your upload is withdrawn.")
    return question + "."


def deleted_text(doc: KbDocument, reply: object) -> str:
    """What a delete did, from the server's reply: removed, or (``kept_for``) kept for the group
    member who uploaded the same bytes, the caller's upload withdrawn."""
    kept_for = getattr(reply, "kept_for", None)   # (older servers, and a removed document: none)
    if kept_for:
        return f"Withdrew your upload of “{doc.name}”; kept for {kept_for}, who uploaded the same bytes"
    return f"Deleted “{doc.name}”"


def name_cell(name: str) -> Text:
    """A document's name in the table: printable, one line, at most ``NAME_MAX_CELLS`` cells (cut
    with an ellipsis), so that a long name leaves room for the other columns."""
    text = Text(printable(name))
    text.truncate(NAME_MAX_CELLS, overflow="ellipsis")
    return text


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
    """One file's upload row: its name and stage, a bar (bytes while receiving, then the server's
    stage done/total, or an indeterminate bar while a stage gives no finer progress), and a
    button to cancel it while it runs."""

    def __init__(self, job: UploadJob) -> None:
        super().__init__(classes="kb-transfer")
        self.job = job

    @property
    def path(self) -> Path:
        return self.job.path

    @property
    def stage(self) -> str:
        return self.job.stage

    @property
    def stages(self) -> list[str]:
        return self.job.stages

    def compose(self) -> ComposeResult:
        with Horizontal(classes="kb-transfer-head"):
            yield Label(self.label(), classes="kb-transfer-title")
            yield Button("Cancel", compact=True, classes="kb-transfer-cancel")
        yield ProgressBar(total=None, show_eta=False, classes="kb-transfer-bar")

    def on_mount(self) -> None:
        self.show()

    def label(self) -> Text:
        job = self.job
        if job.end is not None:   # a refusal quotes the server
            return Text(printable(f"{job.path.name} · {job.end}"),
                        style="red" if job.failed and not job.cancelling else "")
        text = f"{job.path.name} · {job.stage}"
        if job.stage == "receiving" and job.total > 0:
            text += f" {human_size(job.done)} of {human_size(job.total)}"
        elif job.total > 1:
            text += f" {job.done}/{job.total}"
        elif job.stage != WAITING:
            text += "…"   # a stage of one step (parsing a big file is 0/1 until done): no fraction to show
        return Text(printable(text))

    def show(self) -> None:
        """Render the job as it is now."""
        job = self.job
        self.query_one(Label).update(self.label())
        bar = self.query_one(ProgressBar)
        self.query_one(".kb-transfer-cancel", Button).display = job.running
        if not job.running:
            if job.failed:       # refused or cancelled: no bar (an indeterminate one would seem to still run)
                bar.display = False
            else:
                bar.update(total=1, progress=1)
            return
        determinate = job.total > 0 and (job.stage == "receiving" or job.total > 1)
        bar.update(total=job.total if determinate else None, progress=job.done if determinate else 0)

    @on(Button.Pressed, ".kb-transfer-cancel")
    def _cancel(self, event: Button.Pressed) -> None:
        event.stop()
        self.post_message(CancelUpload(self.job))


class CancelUpload(Message):
    def __init__(self, job: UploadJob) -> None:
        super().__init__()
        self.job = job


class KnowledgeScreen(ModalScreen[None]):
    """U uploads (focuses the path input), C cancels the running upload, D downloads the highlighted
    document, Delete deletes it."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Close", show=False),
                Binding("u", "upload", "Upload", show=False),
                Binding("c", "cancel_upload", "Cancel upload", show=False),
                Binding("d", "download", "Download", show=False),
                Binding("delete", "delete", "Delete", show=False)]

    def __init__(self, ops: KnowledgeOps, *, upload_first: bool = False) -> None:
        super().__init__(classes="modal")
        self.ops = ops
        self.upload_first = upload_first
        self.documents: list[KbDocument] = []
        self.loaded = False
        self.uploads = ops.uploads or Uploads(ops.upload)
        self.transfers: dict[UploadJob, Transfer] = {}
        # files a download (or its replace question) is running for: one per file (two would share its .part)
        self.downloading: set[Path] = set()
        # one download runs at a time, the others wait for it: the server answers a connection's requests
        # one at a time, so a second KB_DOWNLOAD would wait there anyway, its reply timeout running
        self._one_download = asyncio.Lock()

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
        for job in self.uploads.jobs:   # uploads started before the panel was (re)opened
            self._show_job(job)
        self.refresh_list()

    def on_unmount(self) -> None:
        for job in self.transfers:
            if job.watch == self._job_changed:
                job.watch = None   # from now on its end is notified

    @work(exclusive=True, group="kb-list")
    async def refresh_list(self) -> None:
        info = self.query_one("#kb-info", Static)
        try:
            self.documents = list(await self.ops.list())
        except Exception as exc:  # noqa: BLE001 - shown to the user, the panel stays usable
            info.update(Text(printable(f"Cannot list the documents: {exc}"), style="red"))
            return
        table = self.query_one("#kb-table", DataTable)
        table.clear()
        for doc in self.documents:
            table.add_row(name_cell(doc.name), human_size(doc.size), str(doc.chunks), Text(printable(doc.collection)),
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
        self._show_job(self.uploads.start(self.app, path))   # its worker starts after this: nothing missed

    def _show_job(self, job: UploadJob) -> None:
        row = Transfer(job)
        self.transfers[job] = row
        job.watch = self._job_changed
        self.query_one("#kb-transfers", VerticalScroll).mount(row)

    def _job_changed(self, job: UploadJob) -> None:
        row = self.transfers.get(job)
        if row is not None and row.is_attached and row.children:   # composed, not being removed
            row.show()
            if job.failed and not job.cancelling:   # refused: its row may be below the fold, so shown and said
                row.scroll_visible()
        if job.end is not None and job.failed and not job.cancelling:
            self.notify(printable(f"Upload of {job.path.name}: {job.end}"), title="Knowledge base",
                        severity="error", timeout=10)
        if job.end is not None and not job.failed:
            self.refresh_list()

    def action_cancel_upload(self) -> None:
        """Cancel the upload that runs now (a waiting one is cancelled with its row's button)."""
        job = next((j for j in self.uploads.jobs if j.stage != WAITING), None)
        if job is None:
            self.notify("No upload is running", severity="warning")
        else:
            self.uploads.cancel(job)

    @on(CancelUpload)
    def _cancel_one(self, event: CancelUpload) -> None:
        self.uploads.cancel(event.job)

    # -- download, delete -------------------------------------------------------------------------------
    def action_download(self) -> None:
        """Download the highlighted document, unless a download into its file already runs or waits."""
        doc = self.selected
        if doc is None:
            return
        dest = self.ops.folder / local_name(doc)[0]   # never a path from the server; shortened when too long
        if dest in self.downloading:
            self.notify(f"Already downloading to {dest}", severity="warning")
            return
        self.downloading.add(dest)
        self._download_unless_kept(doc, dest)

    @work(group="kb-download")
    async def _download_unless_kept(self, doc: KbDocument, dest: Path) -> None:
        """Download into ``dest``, after asking before an existing file there is replaced (another
        document of that name, or an earlier download): No keeps it."""
        if not await asyncio.to_thread(dest.exists):
            self._download(doc, dest)
            return

        def done(ok: bool | None) -> None:
            if ok:
                self._download(doc, dest)
            else:
                self.downloading.discard(dest)
                self.notify(f"Not downloaded: {dest} is kept")
        self.app.push_screen(ConfirmModal(f"{dest} already exists.\n\nReplace it with “{doc.name}” "
                                          f"({human_size(doc.size)}, uploaded {minute(doc.uploaded_at)})?",
                                          "Replace"), done)

    @work(group="kb-download")
    async def _download(self, doc: KbDocument, dest: Path) -> None:
        """Download into ``dest``, after the download running now (if any) has ended."""
        try:
            if self._one_download.locked():
                self.notify(f"{doc.name} {DOWNLOAD_WAITING}")
            async with self._one_download:
                await self.ops.download(doc, dest)
        except asyncio.CancelledError:   # the panel closed (its workers end with it): say so, the part file stays
            self.app.notify(f"Download of {doc.name} {DOWNLOAD_STOPPED}", title="Knowledge base",
                            severity="warning", timeout=10)
            raise
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.notify(f"Download failed: {exc}", severity="error")
            return
        finally:
            self.downloading.discard(dest)
        if local_name(doc)[1]:
            self.notify(f"Downloaded to {dest}: the document's name is too long for a file name "
                        f"({len(doc.name.encode())} bytes), so the file has its start, -{doc.doc_id} and "
                        "its extension", timeout=10)
        else:
            self.notify(f"Downloaded to {dest}")

    def action_delete(self) -> None:
        doc = self.selected
        if doc is None:
            return

        def done(ok: bool | None) -> None:
            if ok:
                self._delete(doc)
        self.app.push_screen(ConfirmModal(delete_question(doc), "Delete"), done)

    @work(group="kb-delete")
    async def _delete(self, doc: KbDocument) -> None:
        """Delete, say what the server did (removed, or kept for a co-uploader: then the refreshed
        list still shows it, now theirs) and refresh the list."""
        try:
            reply = await self.ops.delete(doc.doc_id)
        except Exception as exc:  # noqa: BLE001 - shown to the user
            self.notify(f"Delete failed: {exc}", severity="error")
            return
        self.notify(deleted_text(doc, reply))
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

"""``nplt-client kb ...``: upload, list, search, delete and download knowledge-base documents.

``kb upload PATH... [--group G] [--json]`` prints one line per file (or, with --json, one document
``{"files": [{path, doc_id, name, md5, chunks, duplicate} | {path, error: {code, message}}]}``); a
refused file is reported on stderr with its code and the exit status is non-zero. On a terminal,
stderr shows a progress bar per file (bytes, then the server's stages). ``kb download DOC`` without
``-o`` never replaces an existing file (FILE_EXISTS) unless ``--force``; a document name too long for
a file name is shortened for the local file (``local_name``).
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import sys
import unicodedata
from pathlib import Path
from typing import Any, Callable, TextIO

from protocol import ErrorCode, MsgType

from client import kb as kbclient
from client.config import ClientConfig
from client.connection import Backoff, Client
from client.errors import ClientCode, ClientError
from client.wording import counted, printable, stamp

DOC_FIELDS = ("doc_id", "name", "md5", "chunks", "duplicate")
HIT_FIELDS = ("doc_id", "name", "text", "score", "location", "citation", "chunk_id", "collection")
BAR = 24
#: The longest file name, in bytes, that ``kb download`` gives the local file by default (the
#: document's name in the current folder, or in an ``-o`` folder): what most file systems take (ext4,
#: XFS, btrfs, ZFS: 255 bytes). A server name may be 255 characters, up to 765 UTF-8 bytes (or
#: more), so a longer one is shortened (``local_name``).
FILE_NAME_MAX_BYTES = 255
#: The longest suffix a download adds to the local name: its sidecar ``NAME.part.json``.
PART_SUFFIX = ".part.json"
#: An "extension" longer than this many bytes is not kept apart when a name is shortened.
EXTENSION_MAX_BYTES = 16
#: This process's standard descriptors, which ``kb download`` writes into only when they were open
#: at start (``check_standard_stream``)
STANDARD_STREAMS = {0: "stdin", 1: "stdout", 2: "stderr"}


def _client(cfg: ClientConfig, *, reconnect: bool = False) -> Client:
    """A client for one command; an upload reconnects (and resumes) a few times."""
    return Client(cfg.host, cfg.port, token=cfg.token, tls=cfg.tls.context(), client_name="nplt-cli/0.1",
                  reconnect=reconnect, backoff=Backoff(max_attempts=5 if reconnect else 0),
                  request_timeout=cfg.request_timeout_s, connect_timeout=cfg.connect_timeout_s,
                  event_queue_size=cfg.event_queue_size, liveness_timeout=cfg.liveness_timeout_s)


def _fields(obj: Any, fields: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """The named fields of a typed reply object, as sent on the wire (encoded once)."""
    encoded = obj.encode()
    return {k: encoded[k] for k in fields}


def dump_json(doc: Any, out: TextIO) -> None:
    """Print ``doc`` as one indented JSON document: non-ASCII text as written (UTF-8), or as ``\\uXXXX``
    escapes when ``out``'s encoding cannot hold every character (``client.cli.PrintableWriter.ascii_json``,
    e.g. ``PYTHONIOENCODING=latin-1``), so the document stays valid JSON and decodes to the same text."""
    out.write(json.dumps(doc, ensure_ascii=bool(getattr(out, "ascii_json", False)), indent=2) + "\n")
    out.flush()


_dump = dump_json


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def local_name(doc: Any) -> tuple[str, bool]:
    """The file name ``kb download`` gives ``doc`` by default, and whether it was shortened: the
    document's base name (never a path from the server; its id for an empty one); when that name and
    the download's ``.part.json`` suffix do not fit ``FILE_NAME_MAX_BYTES``, its start (cut at a
    character), then ``-DOC_ID`` and the extension: ``很长的名字…-0123456789abcdef01234567.md``, still unique and
    the same on a run again (so a cut download resumes)."""
    name = Path(doc.name).name or doc.doc_id
    room = FILE_NAME_MAX_BYTES - len(PART_SUFFIX)
    if _utf8_len(name) <= room:
        return name, False
    stem, ext = os.path.splitext(name)
    if _utf8_len(ext) > EXTENSION_MAX_BYTES:
        stem, ext = name, ""
    tail = f"-{Path(doc.doc_id).name}{ext}"
    head = stem.encode("utf-8", "surrogatepass")[:max(0, room - _utf8_len(tail))]
    return head.decode("utf-8", "ignore").rstrip() + tail, True


def _too_long(exc: OSError, given: bool) -> str:
    """A hint for a name the file system refused as too long (``given``: named with ``-o``)."""
    if exc.errno != errno.ENAMETOOLONG:
        return ""
    return " (the name is too long for this file system: " + ("choose a shorter one)" if given
                                                               else "name the file with -o PATH)")


def _bar(err: TextIO, name: str):
    """A progress callback drawing one line on a terminal (nothing otherwise). Its carriage return
    is the CLI's own drawing: it goes to the terminal itself (``client.cli.PrintableWriter.raw``),
    the name (a document's, from the server) made printable."""
    if not err.isatty():
        return None
    term: TextIO = getattr(err, "raw", err)
    name = printable(name)

    def show(stage: str, done: int, total: int) -> None:
        frac = done / total if total > 0 else 0.0
        fill = int(frac * BAR)
        term.write(f"\r{name[:30]:30} {stage:9} [{'#' * fill}{'.' * (BAR - fill)}] {frac:4.0%}")
        if stage == "indexing" and done >= total:
            term.write("\n")
        term.flush()
    return show


async def cmd_kb(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO, *,
                 exit_code_for: Callable[[ClientError], int]) -> int:
    """Run one ``kb`` action; ``exit_code_for`` maps a refused upload to the CLI's exit status."""
    action = args.kb_command
    if action == "upload":
        return await _upload(args, cfg, out, err, exit_code_for)
    async with _client(cfg) as c:
        if action == "list":
            docs = await kbclient.list_documents(c)
            if args.json:
                _dump({"documents": [d.encode() for d in docs]}, out)
            for d in [] if args.json else docs:
                out.write(f"{d.doc_id}  {stamp(d.uploaded_at)}  {d.size:>10}  {counted(d.chunks, 'chunk'):>12}  "
                          f"{d.collection:16}  {d.name}\n")
        elif action == "search":
            hits = (await c.request(MsgType.KB_SEARCH, {"query": args.query, "limit": args.limit})).hits
            if args.json:
                _dump({"hits": [_fields(h, HIT_FIELDS) for h in hits]}, out)
            for h in [] if args.json else hits:
                out.write(f"{h.score:.3f}  {h.citation}  {h.collection}  ({h.chunk_id})\n  {h.text[:300]}\n\n")
        elif action == "delete":
            doc_id = (await _document(c, args.doc_id)).doc_id
            reply = await c.request(MsgType.KB_DELETE, {"doc_id": doc_id})
            kept_for = getattr(reply, "kept_for", None)     # (a group document another member uploaded too)
            if args.json:
                _dump({"doc_id": doc_id, **({"kept_for": kept_for} if kept_for is not None else {})}, out)
            elif kept_for is not None:
                out.write(f"deleted {doc_id} for you; kept for {kept_for}, who uploaded the same bytes\n")
            else:
                out.write(f"deleted {doc_id}\n")
        elif action == "download":
            await _download(c, args, out, err)
    return 0


async def _download(c: Client, args: argparse.Namespace, out: TextIO, err: TextIO) -> None:
    """``kb download DOC [-o FILE | -o DIR] [--force] [--json]``."""
    found = await _document(c, args.doc_id)
    name, shortened = local_name(found)
    dest: str | Path = args.output or name
    try:
        if args.output == "-":         # stdout, as with curl -o -
            dest = "/dev/stdout"
        elif args.output:
            # -o as given (a trailing separator means a folder, which Path() would drop: kb.download checks it)
            dest = os.path.expanduser(args.output)
            if shortened and os.path.isdir(dest):      # a folder: the (shortened) name in it, as cp does
                dest = Path(dest) / name
                if dest.is_dir():
                    raise ClientError(ClientCode.WRITE_FAILED, f"cannot write {dest}: it is a folder")
        else:
            dest = Path(name)
            if not args.force and dest.exists():
                raise ClientError(ClientCode.FILE_EXISTS, f"{dest} exists and is not replaced: name another "
                                  f"file with -o PATH, or replace it with --force")
    except OSError as exc:          # a name the file system refuses (a smaller limit), a folder not readable
        raise ClientError(ClientCode.WRITE_FAILED,
                          f"cannot write {dest}: {exc.strerror or exc}{_too_long(exc, bool(args.output))}") from exc
    if shortened and isinstance(dest, Path):
        err.write(f"nplt-client: the document's name is too long for a file name ({_utf8_len(found.name)} "
                  f"bytes): saving it as {dest} (-o PATH names another file)\n")
    try:
        streamed = await asyncio.to_thread(kbclient.streams_into, dest)
        descriptor = await asyncio.to_thread(kbclient.own_descriptor, dest)
    except OSError as exc:
        raise ClientError(ClientCode.WRITE_FAILED,
                          f"cannot write {dest}: {exc.strerror or exc}{_too_long(exc, bool(args.output))}") from exc
    if descriptor in STANDARD_STREAMS:
        check_standard_stream(descriptor, out)   # before any byte is fetched
    try:
        doc = await kbclient.download(c, found.doc_id, dest, progress=_bar(err, found.name),
                                      replace_part=args.force)
    except OSError as exc:
        if descriptor == 1 and isinstance(exc, BrokenPipeError):
            raise          # stdout's reader went away (| head): client.main stops quietly, exit 0
        raise ClientError(ClientCode.WRITE_FAILED,
                          f"cannot write {dest}: {exc.strerror or exc}{_too_long(exc, bool(args.output))}") from exc
    if err.isatty():
        err.write("\n")
    path = kbclient.target(dest, doc)
    summary = err if streamed else out       # (-o /dev/stdout: the document's bytes are on stdout)
    if args.json:
        _dump({"path": str(path), "doc_id": doc.doc_id, "name": doc.name, "size": doc.size, "md5": doc.md5}, summary)
    else:
        summary.write(f"{path}  {doc.size} bytes  md5 {doc.md5}\n")


def check_standard_stream(fd: int, out: TextIO) -> None:
    """WRITE_FAILED (``stdout: closed``) unless standard stream ``fd`` (0, 1, 2), which a download
    is to be written into (``-o -``, ``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``), was open
    when the process started and still is. A stream the shell closed (``>&-``) leaves its number free,
    and the event loop's own descriptors take it (its epoll, its self-pipe socket): the document would
    be written into them, even "successfully". For stdout, ``out`` (``client.cli.PrintableWriter``)
    says the same first."""
    name = STANDARD_STREAMS[fd]
    check = getattr(out, "check", None) if fd == 1 else None
    if check is not None:
        check()
    stream = getattr(sys, f"__{name}__", None)     # None when the descriptor was not open at start
    try:
        if stream is None or stream.closed or stream.fileno() != fd:
            raise ValueError
        os.fstat(fd)
    except (OSError, ValueError):
        raise ClientError(ClientCode.WRITE_FAILED, f"{name}: closed") from None


def same_name(a: str, b: str) -> bool:
    """Two document names compared as the server compares them (Unicode NFC): a name typed or a file
    saved on macOS comes in NFD, "cafe\u0301.md", and is the same name as "caf\u00e9.md"."""
    return unicodedata.normalize("NFC", a) == unicodedata.normalize("NFC", b)


async def _document(c: Client, ref: str) -> Any:
    """The visible document whose id, or else whose name, is ``ref`` (NOT_FOUND if none; a name that
    several documents share is refused with their ids, so the user picks one)."""
    docs = await kbclient.list_documents(c)
    by_id = [d for d in docs if d.doc_id == ref]
    named = by_id or [d for d in docs if same_name(d.name, ref)]
    if len(named) == 1:
        return named[0]
    if not named:
        raise ClientError(ErrorCode.NOT_FOUND, f"no document with the id or name {ref!r} (see 'kb list')")
    raise ClientError(ErrorCode.INVALID_MESSAGE, f"{len(named)} documents are named {ref!r}: give one of "
                      f"their ids ({', '.join(d.doc_id for d in named)})")


async def _upload(args: argparse.Namespace, cfg: ClientConfig, out: TextIO, err: TextIO,
                  exit_code_for: Callable[[ClientError], int]) -> int:
    results: list[dict[str, Any]] = []
    status = 0
    async with _client(cfg, reconnect=True) as c:
        for raw in args.paths:
            path = Path(raw).expanduser()
            try:
                if not path.is_file():
                    raise ClientError(ClientCode.NOT_A_FILE, "not a readable file")   # the path is shown with it
                doc = await kbclient.upload(c, path, collection=_group_collection(args.group),
                                            progress=_bar(err, path.name))
            except ClientError as exc:
                if exc.is_connection_error:
                    raise
                err.write(f"nplt-client: {exc.code}: {raw}: {exc.message}\n")
                results.append({"path": raw, "error": {"code": exc.code, "message": exc.message}})
                status = status or exit_code_for(exc)
                continue
            result = {"path": raw, **_fields(doc, DOC_FIELDS)}
            # the same bytes were already stored, maybe under another name: the document keeps its
            # first name (and id), which 'kb download' and 'kb delete' take
            renamed = doc.duplicate and path.name != doc.name
            if args.replace:
                result["replaced"] = await _replace_older(c, doc, path.name if renamed else doc.name)
            results.append(result)
            if not args.json:
                dup = ""
                if doc.duplicate:
                    dup = f"  (duplicate: {raw} is already stored as \"{doc.name}\")" if renamed \
                        else "  (duplicate: already stored)"
                out.write(f"{doc.doc_id}  {doc.md5}  {counted(doc.chunks, 'chunk'):>12}  {doc.name}{dup}\n")
                for old in result.get("replaced", ()):
                    out.write(f"  replaced {old}\n")
                if args.replace and renamed:
                    out.write(f"  --replace: {counted(len(result['replaced']), 'older document')} of yours "
                              f"named \"{path.name}\" replaced; those named \"{doc.name}\" are kept\n")
    if args.json:
        _dump({"files": results}, out)
    return status


async def _replace_older(c: Client, doc: Any, name: str) -> list[str]:
    """``--replace``: delete the other documents called ``name`` (the uploaded file's own name) that
    the caller uploaded into ``doc``'s collection (an edited file uploaded again: its old passages
    would still be found). Returns their ids. Documents of the name that others uploaded stay, and
    so do documents of another name, e.g. the one a duplicate upload was already stored as (its
    ``doc.uploader`` is whoever stored the bytes first, not necessarily the caller)."""
    me = c.hello.user if c.hello is not None else None
    docs = await kbclient.list_documents(c, doc.collection)
    older = [d.doc_id for d in docs if same_name(d.name, name) and d.collection == doc.collection
             and d.uploader == me and d.doc_id != doc.doc_id]
    for doc_id in older:
        await c.request(MsgType.KB_DELETE, {"doc_id": doc_id})
    return older


def _group_collection(group: str | None) -> str | None:
    """``--group G`` names group G's collection ("group:G"), never the user's own: before, ``--group
    personal`` was sent as "personal" and stored into the user's own collection without a word."""
    if group is None:
        return None
    return group if group.startswith("group:") else f"group:{group}"


def _group(text: str) -> str:
    """``--group G``: a group's name (or "group:G"). An empty or blank one is a usage error (exit 2,
    before connecting): before, ``--group ""`` was sent as the collection "group:", which the server
    refused as FORBIDDEN, as if the user were not in some group."""
    name = text[len("group:"):] if text.startswith("group:") else text
    if not name.strip():
        raise argparse.ArgumentTypeError(f"expected a group's name, got {text!r} "
                                         "(leave --group out to upload into your own collection)")
    return text


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected an integer in 1..100, got {text!r}")
    return value


def add_kb_parser(sub: Any) -> None:
    p = sub.add_parser("kb", help="knowledge base: upload, list, search, delete, download documents")
    kb = p.add_subparsers(dest="kb_command", metavar="ACTION", required=True)
    q = kb.add_parser("upload", help="upload files (resumed after a dropped connection)")
    q.add_argument("paths", nargs="+", metavar="PATH")
    q.add_argument("--group", metavar="G", type=_group, help="into group G's collection (default: your own)")
    q.add_argument("--replace", action="store_true",
                   help="then delete your older documents of the same name in that collection")
    q.add_argument("--json", action="store_true")
    q = kb.add_parser("list", help="documents you can see, newest first")
    q.add_argument("--json", action="store_true")
    q = kb.add_parser("search", help="the best passages for a query, with citations")
    q.add_argument("query")
    q.add_argument("--limit", type=_limit, default=5, metavar="N", help="1..100 passages (default 5)")
    q.add_argument("--json", action="store_true")
    q = kb.add_parser("delete", help="delete a document (its uploader or an admin)")
    q.add_argument("doc_id", metavar="DOC", help="the document's id or name (from 'kb list')")
    q.add_argument("--json", action="store_true", help='print {"doc_id"}')
    q = kb.add_parser("download", help="download a document (resumes FILE.part)")
    q.add_argument("doc_id", metavar="DOC", help="the document's id or name (from 'kb list')")
    q.add_argument("-o", "--output", metavar="FILE",
                   help="write to FILE, replacing it; a FIFO, a device or a symlink's target is written "
                        "through; '-' is stdout (default: the document's name in this directory, never "
                        "replaced without --force)")
    q.add_argument("--force", action="store_true",
                   help="without -o: replace an existing file of the document's name")
    q.add_argument("--json", action="store_true", help='print {"path", "doc_id", "name", "size", "md5"}')


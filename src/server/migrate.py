"""``nplt-server migrate-json-to-pg --data-dir D --storage-url U [--user-memory-dir M] [--config F]``: copy
a JSON store into PostgreSQL and verify it: the history (``storage.pg.migrate``: every session whole,
counts compared), the long-term user memory files (``server.memory.user_store_pg.copy_user_files``; by
default ``D/user_memory``, where the server keeps them unless ``user_memory.root`` says otherwise)
and the knowledge base (``server.knowledge.pg_store.copy_documents``: the documents under
``D/knowledge``, where the JSON backend keeps them). A rerun copies nothing that is there already
and verifies again.

Besides what each copy verifies, this command checks:

- every session with files in ``D`` (a snapshot, or a journal holding data without one) ends up in
  PostgreSQL: the session files are listed *before* the JSON store is opened, because opening it
  moves a damaged session to ``D/quarantine/`` (and it is then neither listed nor copied). A session
  whose files are in ``quarantine/`` and that PostgreSQL does not hold is a MISMATCH (exit 1) on
  every run, until its files are repaired and moved back, or moved out of ``quarantine/``;
- a user memory row that PostgreSQL held before the copy is kept (the database is in use): if it
  differs from the file, that is a NOTE (what was kept, how many of the file's items were not
  copied), not a MISMATCH that no rerun can resolve;
- the copied documents against the target's ``[knowledge] user_quota_bytes`` and
  ``max_documents_per_collection`` (from ``--config``, else the defaults): the copy keeps every
  document whatever the quotas, and each uploader or collection over them is a NOTE (their next
  upload is refused).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from server.config import load_toml
from server.config_base import ConfigError
from server.knowledge.config import KnowledgeConfig
from server.knowledge.pg_store import KnowledgeCopy, copy_documents
from server.knowledge.store import FileDocumentStore
from server.memory.user_store import UserDoc
from server.memory.user_store_pg import UserMemoryCopy, copy_user_files
from storage.config import StorageConfig
from storage.errors import StorageError
from storage.fsio import QUARANTINE_DIR, read_bytes
from storage.ids import JOURNAL_RE, SNAPSHOT_RE, snapshot_name
from storage.pg.link import PgLink
from storage.pg.migrate import MigrationReport, migrate_json_to_pg

#: a session file set aside by the JSON store: ``<snapshot or journal name>.<UTC timestamp>[.<n>]``
_QUARANTINED_RE = re.compile(r"session_([0-9]{8})_(s_[0-9]{8}_[0-9a-f]{12})\.(?:json|journal)\..+")
#: at most this many names listed in one NOTE or MISMATCH line (the rest counted)
SHOWN_NAMES = 5


@dataclass
class SessionFiles:
    """The sessions found in the JSON store's directory before it is opened, and the files that
    were in its ``quarantine/`` then (read only: nothing is moved or removed)."""
    sessions: set[str] = field(default_factory=set)
    orphans: set[str] = field(default_factory=set)     # of which: a journal holding data, no snapshot
    quarantined: set[str] = field(default_factory=set)


@dataclass
class Checks:
    """What ``check_sessions`` adds to the history copy's report: how many sessions found in the
    directory or in its ``quarantine/`` are not in PostgreSQL, notes and mismatches."""
    not_copied: int = 0
    notes: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []


def scan_sessions(data_dir: str) -> SessionFiles:
    """The sessions of the JSON store under ``data_dir`` by their file names (as the store's start
    finds them): each snapshot, and each journal without a snapshot unless it is an empty regular
    file (a create killed before its snapshot: nothing was acknowledged, the store deletes it)."""
    out = SessionFiles(quarantined=set(_listdir(os.path.join(data_dir, QUARANTINE_DIR))))
    journals: dict[str, str] = {}
    for name in _listdir(data_dir):
        m = SNAPSHOT_RE.fullmatch(name) or JOURNAL_RE.fullmatch(name)
        if m is None or m.group(2)[2:10] != m.group(1):
            continue
        if name.endswith(".json"):
            out.sessions.add(m.group(2))
        else:
            journals[m.group(2)] = name
    for sid, name in journals.items():
        if sid in out.sessions:
            continue
        try:
            st = os.lstat(os.path.join(data_dir, name))
        except FileNotFoundError:
            continue
        if not (stat.S_ISREG(st.st_mode) and st.st_size == 0):
            out.sessions.add(sid)
            out.orphans.add(sid)
    return out


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN_NAMES])
    return shown if len(names) <= SHOWN_NAMES else f"{shown} and {len(names) - SHOWN_NAMES} more"


async def check_sessions(data_dir: str, before: SessionFiles, report: MigrationReport, link: PgLink) -> Checks:
    """Every session seen on disk before the copy, or with files in ``quarantine/``, is in
    PostgreSQL; the ones that are not are mismatches (except those the history copy reported
    already), and a journal copied to ``quarantine/`` during the run (unreadable lines left out of
    the session) is a note."""
    checks = Checks()
    qdir = os.path.join(data_dir, QUARANTINE_DIR)
    in_quarantine: dict[str, list[str]] = {}
    for name in sorted(_listdir(qdir)):
        m = _QUARANTINED_RE.fullmatch(name)
        if m is not None and m.group(2)[2:10] == m.group(1):
            in_quarantine.setdefault(m.group(2), []).append(name)
    candidates = sorted(before.sessions | set(in_quarantine))
    held = {r["session_id"] for r in await link.run(lambda con: con.fetch(
        "SELECT session_id FROM nplt_sessions WHERE session_id = ANY($1)", candidates), write=False)}
    reported = {line.split(":", 1)[0] for line in report.mismatches}
    for sid in candidates:
        moved = in_quarantine.get(sid, [])
        new = [n for n in moved if n not in before.quarantined]
        if sid in held:
            if new:
                checks.notes.append(f"session {sid}: the JSON store set files of it aside in quarantine/ "
                                    f"({_names(new)}); PostgreSQL holds the session, without what only "
                                    f"those files hold (e.g. unreadable journal lines)")
            continue
        if sid not in before.sessions and not new and not any(n.startswith(snapshot_name(sid) + ".") for n in moved):
            checks.notes.append(f"session {sid}: only a journal of it is in {qdir}/ ({_names(moved)}), set "
                                f"aside earlier (e.g. a purge cut short by a crash): not copied")
            continue
        checks.not_copied += 1
        if sid in reported:
            continue                               # (the history copy said why already)
        if new:
            what = ("a journal without a snapshot (e.g. a purge cut short by a crash)" if sid in before.orphans
                    else "damaged")
            checks.mismatches.append(f"session {sid}: {what}, moved to {qdir}/ by the JSON store "
                                     f"({_names(new)}): not copied")
        elif sid in before.sessions:
            checks.mismatches.append(f"session {sid}: its files are in {data_dir} but the JSON store did not "
                                     f"serve it (see the log lines above): not copied")
        else:
            checks.mismatches.append(f"session {sid}: set aside earlier as damaged, its files are in {qdir}/ "
                                     f"({_names(moved)}): not copied (repair them and move them back under "
                                     f"their original names, or move them out of quarantine/ to leave the "
                                     f"session behind)")
    return checks


def _file_items(root: str) -> dict[str, list[str]]:
    """The item ids of each user memory file under ``root`` that can be read (the others are
    ``copy_user_files``' mismatches)."""
    out: dict[str, list[str]] = {}
    for path in sorted(Path(root).glob("*.json")) if os.path.isdir(root) else []:
        try:
            user, doc = UserDoc.read(orjson.loads(read_bytes(str(path))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        out[user] = [i.id for i in doc.items]
    return out


async def _rows_items(link: PgLink, users: list[str]) -> dict[str, list[str]]:
    rows = await link.run(lambda con: con.fetch(
        "SELECT user_id, doc FROM nplt_user_memory WHERE user_id = ANY($1)", users), write=False)
    return {r["user_id"]: [i["id"] for i in orjson.loads(r["doc"]).get("items", [])] for r in rows}


async def copy_memory(root: str, link: PgLink) -> tuple[UserMemoryCopy, list[str]]:
    """``copy_user_files``, and a note instead of its mismatch for each user whose row PostgreSQL
    held before the copy (kept as it is: the database is in use) and that differs from the file."""
    files = await asyncio.to_thread(_file_items, root)
    kept = await _rows_items(link, list(files))            # (before the copy: these rows are not written)
    memory = await copy_user_files(root, link)
    notes: list[str] = []
    for user, row in sorted(kept.items()):
        want = files[user]
        if row == want:
            continue
        prefix = f"user memory of {user!r}:"             # (copy_user_files' line for that user)
        memory.mismatches = [m for m in memory.mismatches if not m.startswith(prefix)]
        missing = len(set(want) - set(row))
        notes.append(f"user memory of {user!r}: PostgreSQL held a row already ({len(row)} items), kept as "
                     f"it is; {missing} of the file's {len(want)} items are not in it and were not copied")
    return memory, notes


async def check_limits(root: str, link: PgLink, limits: KnowledgeConfig) -> list[str]:
    """Notes for the uploaders and collections of the file store's documents that PostgreSQL now
    holds over the target's ``user_quota_bytes`` or ``max_documents_per_collection``."""
    files = FileDocumentStore(root)

    def owners() -> tuple[set[str], set[str]]:
        uploaders, collections = set(), set()
        if files.collections.is_dir():
            for _, meta in files.documents():
                if isinstance(meta, dict) and isinstance(meta.get("uploader"), str):
                    uploaders.add(meta["uploader"])
                if isinstance(meta, dict) and isinstance(meta.get("collection"), str):
                    collections.add(meta["collection"])
        return uploaders, collections
    uploaders, collections = await asyncio.to_thread(owners)
    if not uploaders and not collections:
        return []

    async def usage(con):
        used = await con.fetch("SELECT uploader, sum(size) AS bytes FROM nplt_kb_documents "
                               "WHERE uploader = ANY($1) GROUP BY uploader", sorted(uploaders))
        counts = await con.fetch("SELECT collection, count(*) AS n FROM nplt_kb_documents "
                                 "WHERE collection = ANY($1) GROUP BY collection", sorted(collections))
        return used, counts
    used, counts = await link.run(usage, write=False)
    notes = [f"knowledge base: {r['uploader']!r} has {r['bytes']} bytes of documents in PostgreSQL, over "
             f"user_quota_bytes = {limits.user_quota_bytes}: kept, but their next upload is refused"
             for r in sorted(used, key=lambda r: r["uploader"]) if r["bytes"] > limits.user_quota_bytes]
    notes += [f"knowledge base: collection {r['collection']!r} holds {r['n']} documents in PostgreSQL, over "
              f"max_documents_per_collection = {limits.max_documents_per_collection}: kept, but the next "
              f"upload to it is refused"
              for r in sorted(counts, key=lambda r: r["collection"]) if r["n"] > limits.max_documents_per_collection]
    return notes


@dataclass
class Outcome:
    report: MigrationReport
    sessions: Checks
    memory: UserMemoryCopy
    knowledge: KnowledgeCopy
    notes: list[str] = field(default_factory=list)


async def migrate(data_dir: str, url: str, user_memory_dir: str,
                  limits: KnowledgeConfig | None = None) -> Outcome:
    before = await asyncio.to_thread(scan_sessions, data_dir)   # (before the store moves anything)
    report = await migrate_json_to_pg(data_dir, url)       # (applies the schema migrations too)
    link = PgLink(StorageConfig(url=url))
    await link.open()
    try:
        sessions = await check_sessions(data_dir, before, report, link)
        memory, notes = await copy_memory(user_memory_dir, link)
        kb_root = os.path.join(data_dir, "knowledge")
        knowledge = await copy_documents(kb_root, link)
        notes += await check_limits(kb_root, link, limits or KnowledgeConfig())
        return Outcome(report, sessions, memory, knowledge, notes)
    finally:
        await link.close()


def _limits(path: str | None) -> KnowledgeConfig:
    """The target's ``[knowledge]`` section of the config file at ``path`` (defaults without one)."""
    data = load_toml(path) if path else {}
    section = data.get("knowledge", {})
    if not isinstance(section, dict):
        raise ConfigError("knowledge", "expected a table")
    return KnowledgeConfig.from_dict(section)


def main(argv: list[str]) -> int:
    """Exit 0 when everything matches, 1 if not (or on a storage error), 2 on bad usage."""
    p = argparse.ArgumentParser(prog="nplt-server migrate-json-to-pg",
                                description="Copy a JSON history store, its user memory and its knowledge "
                                            "base into PostgreSQL and verify the counts.")
    p.add_argument("--data-dir", required=True, metavar="DIR", help="the JSON store (storage.root)")
    p.add_argument("--storage-url", metavar="URL", default=os.environ.get("NPLT_STORAGE_URL"),
                   help="postgresql://... (env NPLT_STORAGE_URL)")
    p.add_argument("--user-memory-dir", metavar="DIR",
                   help="the user memory files (user_memory.root; default DIR/user_memory)")
    p.add_argument("--config", metavar="PATH", default=os.environ.get("NPLT_CONFIG"),
                   help="the config file of the server that will run on PostgreSQL (env NPLT_CONFIG): its "
                        "[knowledge] quotas are checked against the copied documents (default: the defaults)")
    ns = p.parse_args(argv)
    if not ns.storage_url:
        p.error("--storage-url (or NPLT_STORAGE_URL) is required")
    try:
        limits = _limits(ns.config)
    except ConfigError as exc:
        print(f"nplt-server migrate-json-to-pg: configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        StorageConfig(url=ns.storage_url)
        out = asyncio.run(migrate(ns.data_dir, ns.storage_url,
                                  ns.user_memory_dir or os.path.join(ns.data_dir, "user_memory"), limits))
    except (StorageError, ValueError) as exc:
        print(f"nplt-server migrate-json-to-pg: {exc}", file=sys.stderr)
        return 1
    report, memory, knowledge = out.report, out.memory, out.knowledge
    lost = out.sessions.not_copied
    print(f"{report.sessions + lost} sessions: {report.copied} copied ({report.messages} messages), "
          f"{report.already} already in PostgreSQL" + (f", {lost} not copied" if lost else ""))
    print(f"user memory of {memory.users} users: {memory.copied} copied, {memory.already} already in PostgreSQL")
    print(f"knowledge base: {knowledge.documents} documents: {knowledge.copied} copied ({knowledge.bytes} bytes), "
          f"{knowledge.already} already in PostgreSQL")
    for line in out.sessions.notes + out.notes + knowledge.notes:
        print(f"NOTE {line}")
    mismatches = report.mismatches + out.sessions.mismatches + memory.mismatches + knowledge.mismatches
    for line in mismatches:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("verified: counts match" if not mismatches else f"{len(mismatches)} mismatches")
    return 0 if not mismatches else 1

"""``nplt-server migrate-json-to-pg --data-dir D --storage-url U [--user-memory-dir M]``: copy a JSON
store into PostgreSQL and verify it: the history (``storage.pg.migrate``: every session whole, counts
compared), the long-term user memory files (``server.memory.user_store_pg.copy_user_files``; by
default ``D/user_memory``, where the server keeps them unless ``user_memory.root`` says otherwise)
and the knowledge base (``server.knowledge.pg_store.copy_documents``: the documents under
``D/knowledge``, where the JSON backend keeps them). A rerun copies nothing that is there already
and verifies again."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys

from server.knowledge.pg_store import KnowledgeCopy, copy_documents
from server.memory.user_store_pg import UserMemoryCopy, copy_user_files
from storage.config import StorageConfig
from storage.errors import StorageError
from storage.pg.link import PgLink
from storage.pg.migrate import MigrationReport, migrate_json_to_pg


async def migrate(data_dir: str, url: str, user_memory_dir: str
                  ) -> tuple[MigrationReport, UserMemoryCopy, KnowledgeCopy]:
    report = await migrate_json_to_pg(data_dir, url)       # (applies the schema migrations too)
    link = PgLink(StorageConfig(url=url))
    await link.open()
    try:
        memory = await copy_user_files(user_memory_dir, link)
        return report, memory, await copy_documents(os.path.join(data_dir, "knowledge"), link)
    finally:
        await link.close()


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
    ns = p.parse_args(argv)
    if not ns.storage_url:
        p.error("--storage-url (or NPLT_STORAGE_URL) is required")
    try:
        StorageConfig(url=ns.storage_url)
        report, memory, knowledge = asyncio.run(migrate(ns.data_dir, ns.storage_url,
                                                        ns.user_memory_dir or os.path.join(ns.data_dir, "user_memory")))
    except (StorageError, ValueError) as exc:
        print(f"nplt-server migrate-json-to-pg: {exc}", file=sys.stderr)
        return 1
    print(f"{report.sessions} sessions: {report.copied} copied ({report.messages} messages), "
          f"{report.already} already in PostgreSQL")
    print(f"user memory of {memory.users} users: {memory.copied} copied, {memory.already} already in PostgreSQL")
    print(f"knowledge base: {knowledge.documents} documents: {knowledge.copied} copied ({knowledge.bytes} bytes), "
          f"{knowledge.already} already in PostgreSQL")
    for line in knowledge.notes:
        print(f"NOTE {line}")
    mismatches = report.mismatches + memory.mismatches + knowledge.mismatches
    for line in mismatches:
        print(f"MISMATCH {line}", file=sys.stderr)
    print("verified: counts match" if not mismatches else f"{len(mismatches)} mismatches")
    return 0 if not mismatches else 1

"""An exact identifier in the query (a host, an IP, an error code, a version, a date) ranks the
passages holding it whole above passages holding only its pieces. Before, "db-01" ranked
"db-stage-01 ran out of disk" (2.000) above "The primary database host is db-01" (1.983), and in 40
similar incidents 1 host and 2 IPs ranked another incident first ("10.2.10.30": "Incident 30")."""
from __future__ import annotations

import random

from server.knowledge.index import ChunkIndex, chunk_terms


def index_of(chunks: list[tuple[str, list[str]]]) -> ChunkIndex:
    index = ChunkIndex(1.2, 0.75, 1.0)
    docs = [{"text": t, "location": {"heading": h}} for t, h in chunks]
    index.add("d", "user:a", docs, [chunk_terms(t, h, 1.0) for t, h in chunks], None)
    return index


def top(index: ChunkIndex, query: str) -> str:
    return index.chunks[index.search(query, ["user:a"], 3)[0][0]].text


def test_identifiers_of_a_query_as_written() -> None:
    from server.knowledge.rerank import identifiers
    assert identifiers("which rack is db-01 in? 10.2.10.30, ERR-4031 and v1.2.3 since 2026-10-01.") == [
        "db-01", "10.2.10.30", "err-4031", "v1.2.3", "2026-10-01"]
    assert identifiers("db-01在哪个机架？x86_64 端口 9100 R4 well-known") == ["db-01", "x86_64"]


def test_an_exact_host_outranks_a_host_sharing_its_pieces() -> None:
    exact = "The primary database host is db-01, in rack R4."
    index = index_of([
        (exact, ["Hosts A"]),
        ("Last week db-stage-01 ran out of disk; the db team moved the stage data to db-stage-02.", ["Hosts B"]),
        ("Owner: platform team. Last reviewed 2026-10-01.", ["Database Runbook"]),
        ("The replica prod-db-01 follows the primary; db-01-b is its standby.", ["Hosts C"]),  # not db-01
    ])
    for q in ("db-01", "DB-01", "which rack is db-01 in?", "db-01在哪个机架"):
        assert top(index, q) == exact, q


def test_every_identifier_of_forty_similar_incidents_finds_its_own() -> None:
    rng = random.Random(3)
    chunks, ids = [], []
    for i in range(40):
        row = (f"ERR-{4000 + i * 7}", f"db-{rng.choice(['prod', 'stage'])}-{i:02d}.dc{i % 3}.acme.io",
               f"10.{i % 4}.{i}.{i * 3 % 250}", f"v{i % 5}.{i % 7}.{i}")
        ids.append(row)
        chunks.append((f"The service failed with {row[0]} on {row[1]} ({row[2]}) after upgrading to {row[3]}. "
                       "The on-call engineer restarted the service and the error cleared after a few minutes.",
                       ["Incidents", f"Incident {i}"]))
    index = index_of(chunks)
    missed = [q for row in ids for q in row if q not in top(index, q)]
    assert missed == []

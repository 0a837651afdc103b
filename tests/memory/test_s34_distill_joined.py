"""A request to keep something joined to another request in one sentence is kept as what it says.

Before, "show memory and remember that the staging server is stage-7.internal" was kept whole, the
request to show memory included, as a fact; the offline agent answered the remember clause apart
("Noted: - The staging server is stage-7.internal") while the memory stored the whole sentence."""
from __future__ import annotations

import pytest

from server.memory.distill import distill_rules


@pytest.mark.parametrize("text,kept", [
    ("show memory and remember that the staging server is stage-7.internal",
     [("fact", "The staging server is stage-7.internal")]),
    ("show disk usage, note: the backup host is bk-3", [("fact", "The backup host is bk-3")]),
    ("查看内存，然后记住预发服务器是 stage-7.internal", [("fact", "预发服务器是 stage-7.internal")]),
    ("tail app.log and also remember that our prod DB host is db-prod-42.", [("fact", "Our prod DB host is db-prod-42.")]),
])
def test_a_request_to_keep_joined_to_another_is_kept_alone(text, kept):
    assert distill_rules(text) == kept


@pytest.mark.parametrize("text,kept", [
    ("remember that the staging server is stage-7.internal", [("fact", "The staging server is stage-7.internal")]),
    ("The prod DB host is db-prod-42.", [("fact", "The prod DB host is db-prod-42.")]),
    ("show memory and cpu", []),
])
def test_a_sentence_without_a_joined_request_to_keep_is_read_as_before(text, kept):
    assert distill_rules(text) == kept


@pytest.mark.parametrize("text", [
    "The backup runs at 02:00, note that this is UTC.",
    "The cache is redis-2, and don't forget that it is not the primary.",
    "主库是 db-7，请记住这一点。",
    "The DB host is db-7 and remember to rotate the key monthly.",
])
def test_a_statement_followed_by_a_request_to_keep_stays_one_sentence(text):
    """Cut there, the statement was lost and the kept half meant nothing ("This is UTC.", "请记住这一点。")."""
    assert distill_rules(text) == [("fact", text)]

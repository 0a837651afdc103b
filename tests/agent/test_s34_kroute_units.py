"""The pieces of the s34 knowledge-route fixes: which words of a question only say what is done
(``incidental_terms``), which questions hold a reading against the documents (``mixed_readings``), the
words that name the documents, and the comparison of a reading with the values quoted
(``compare_readings``), on fixed readings."""
from __future__ import annotations

import json

from server.agent import knowledge_answer, knowledge_route
from storage.models import ToolCall

PASSAGES = [
    {"citation": "[disk.md §Disk runbook > Thresholds, lines 4-5]", "chunk_id": 1, "doc_id": "d1", "name": "disk.md",
     "location": {"heading": ["Disk runbook", "Thresholds"]}, "score": 3.0,
     "text": "The disk usage alert fires when any filesystem is above 85% for 10 minutes.\n"
             "At 95% the on-call engineer must page the storage team."},
    {"citation": "[oncall.md §On-call runbook > Memory, lines 11-12]", "chunk_id": 2, "doc_id": "d2", "name": "oncall.md",
     "location": {"heading": ["On-call runbook", "Memory"]}, "score": 2.0,
     "text": "If swap usage is above 50% for 15 minutes, restart the worker pool.\nThe memory alert threshold is 90% of RAM."},
]


def _search(passages=PASSAGES) -> ToolCall:
    return ToolCall(id="k", tool_name="search_knowledge", arguments={}, result=json.dumps({"passages": passages}))


def _reading(metric: str, data: dict) -> ToolCall:
    return ToolCall(id="r", tool_name="sys_monitor", arguments={"metric": metric},
                    result=json.dumps({"metric": metric, metric: data}))


def _cites(*ids: int) -> list[dict]:
    return [knowledge_answer.cite(p) for p in PASSAGES if p["chunk_id"] in ids]


def test_words_that_only_say_what_is_done_are_incidental_and_nouns_are_not():
    f = knowledge_route.incidental_terms
    assert f("how many days of backups are kept?") == {"kept"}
    assert f("how long are backups kept on disk?") == {"kept"}
    assert f("Who do I escalate to?") == {"escal"}
    assert "high" in f("what should I do when swap is high?")
    assert f("is swap usage above the limit?") == {"limit"}
    assert f("Who approves production deployments?") == set()
    assert f("What is the password of the Kafka cluster?") == set()
    assert "us" not in knowledge_route.key_terms("what port does the production database use?")   # a plain verb


def test_the_runbook_the_wiki_and_the_playbook_name_the_documents():
    for text in ("what does the runbook say to do when swap is high?", "is it in the on-call runbook?",
                 "check our wiki for the VPN port", "what do the playbooks say about restores?"):
        assert knowledge_route.KEYWORDS.search(text), text
    assert knowledge_route.search_query("what does the runbook say to do when swap is high?") == \
        "to do when swap is high?"
    assert not knowledge_route.KEYWORDS.search("how do I write a runbook?")


def test_which_questions_hold_a_reading_against_the_documents():
    f = knowledge_route.mixed_readings
    assert f("is the disk above the threshold in the runbook?", ["disk"]) == ("disk",)
    assert f("is swap usage above the limit in the runbook?", ["memory"]) == ("memory",)
    assert f("磁盘使用率超过告警阈值了吗？", ["disk"]) == ("disk",)
    assert f("is disk usage above 85%?", ["disk"]) == ()                 # no setting: the reading only
    assert f("目前磁盘使用率超过多少会触发告警", ["disk"]) == ()            # asks the value: the documents only
    assert f("what does the runbook say to do when swap is high?", ["memory"]) == ()
    assert f("is port 5432 above the limit in the runbook?", ["network_check"]) == ()
    assert knowledge_route.reading_subjects("is swap usage above the limit?", ["memory"]).keys() == {"swap"}
    assert knowledge_route.reading_subjects("is memory above the limit?", ["memory"]).keys() == {"memory"}


def test_a_reading_is_compared_with_the_quoted_values_of_its_subject_and_unit():
    disk = _reading("disk", {"filesystems": [{"mount": "/", "percent": 88.5}, {"mount": "/boot", "percent": 95.0}]})
    out = knowledge_answer.compare_readings(_search(), _cites(1, 2), [disk], "is the disk above the threshold?",
                                            ["disk"], False)
    assert out == "Compared with the text quoted: / is at 88.5%: above 85%, below 95%; /boot is at 95%: above 85%, at 95%."
    zh = knowledge_answer.compare_readings(_search(), _cites(1), [disk], "磁盘超过阈值了吗", ["disk"], True)
    assert zh == "与引用的内容比较：/ 当前 88.5%，高于 85%，低于 95%；/boot 当前 95%，高于 85%，等于 95%。"

    memory = _reading("memory", {"percent": 40.0, "swap": {"total": "2.0 GiB", "used": "1.5 GiB", "percent": 75.0}})
    out = knowledge_answer.compare_readings(_search(), _cites(1, 2), [memory], "is swap usage above the limit?",
                                            ["memory"], False)
    assert out == "Compared with the text quoted: swap is at 75%: above 50%."       # not the disk's, nor RAM's 90%
    out = knowledge_answer.compare_readings(_search(), _cites(1, 2), [memory], "is memory above the threshold?",
                                            ["memory"], False)
    assert out == "Compared with the text quoted: memory is at 40%: below 90%."

    no_swap = _reading("memory", {"percent": 40.0, "swap": {"total": "0 B", "used": "0 B", "percent": 0.0}})
    assert knowledge_answer.compare_readings(_search(), _cites(2), [no_swap], "is swap above the limit?", ["memory"],
                                             False) == "No comparison was made for swap: this machine has none."
    # the quoted text holds no percentage about the disk (only "10 minutes"): no comparison
    minutes = [{**PASSAGES[0], "text": "The disk alert waits 10 minutes before it fires."}]
    out = knowledge_answer.compare_readings(_search(minutes), [knowledge_answer.cite(minutes[0])], [disk],
                                            "is the disk above the threshold?", ["disk"], False)
    assert out == "No comparison was made for the disk: the text quoted states no value in % about it."
    failed = ToolCall(id="r", tool_name="sys_monitor", arguments={"metric": "disk"}, result="{}", status="error")
    assert knowledge_answer.compare_readings(_search(), _cites(1), [failed], "is the disk above the threshold?",
                                             ["disk"], False) == "No comparison was made for the disk: it was not read."

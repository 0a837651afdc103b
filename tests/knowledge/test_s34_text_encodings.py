"""Short GBK / Big5 / EUC-KR notes are read in their own encoding (before: GBK "机房温度：41℃，空调——故障"
came out as Thai, GBK with “” …… as Big5 garbage, Big5 as half-width katakana, EUC-KR Korean always as
GBK hanzi, all accepted silently and never found by a search); and over a real server with the CLI."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Iterator

import pytest

from server.knowledge import encodings
from server.knowledge.encodings import decode_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))   # for client_testlib
from client_testlib import ServerThread  # noqa: E402

from client.main import main  # noqa: E402

pytestmark = pytest.mark.usefixtures("isolated_client_config")   # (it runs the CLI in this process)

NOTES = [
    ("机房温度：41℃，空调——故障", "gbk"),                      # ℃ and —— are outside CJK punctuation
    ("注意：“生产库”与“测试库”不能混用……", "gbk"),               # “” ……
    ("① 每日检查：磁盘 × 3、内存 × 2。", "gbk"),                  # ① ×
    ("温度≥30℃时报警 · 备份→恢复", "gbk"),
    ("備份失敗：磁碟已滿，請清理 /var/log。", "big5"),
    ("資料庫連線逾時", "big5"),
    ("磁碟已滿", "big5"),
    ("백업 실패: 디스크가 가득 찼습니다", "euc-kr"),
    ("서버 점검 중입니다", "euc-kr"),
    ("안녕하세요", "euc-kr"),
    ("데이터베이스 연결 시간 초과", "cp949"),
]


@pytest.mark.parametrize("text, codec", NOTES)
def test_a_short_cjk_note_is_read_in_its_own_encoding(text, codec):
    assert decode_text(text.encode(codec)) == text


def test_an_implausible_guess_on_a_short_file_is_replaced_by_its_chinese_reading():
    text = "ＰＳ：αβγ版本说明"                      # Greek: not "mostly Chinese"; guessed as UTF-16-BE (Yi, Hangul)
    assert decode_text(text.encode("gbk")) == text
    for text, codec, wrong in [("机房温度：41℃，空调——故障", "gbk", "cp874"),
                               ("備份失敗：磁碟已滿，請清理 /var/log。", "big5", "cp932")]:
        data = text.encode(codec)
        assert encodings._rescue_cjk(data, data.decode(wrong)) == text
    thai = "ภาษาไทย สวัสดี".encode("cp874")           # a plausible guess, or no reading of mostly common hanzi: kept
    assert encodings._rescue_cjk(thai, thai.decode("cp874")) == thai.decode("cp874")
    long = ("机房温度：41℃，空调——故障\n" * 400).encode("gbk")
    assert len(long) > encodings.CJK_RESCUE_MAX_BYTES
    assert encodings._rescue_cjk(long, long.decode("cp874")) == long.decode("cp874")


@pytest.mark.parametrize("text, codec", [
    ("备份", "gbk"), ("重启", "gbk"), ("日志目录在/var/log/app下。", "gbk"), ("配置：端口８０８０，超时３０秒！", "gbk"),
    ("数据库主机是db-7，备份在凌晨两点运行。恢复超时时间为四十五分钟。\n" * 3, "gbk"),
    ("資料庫主機是db-7，備份在凌晨兩點執行。恢復逾時為四十五分鐘。\n" * 3, "big5"),
    ("データベースのホストはdb-7です。バックアップは午前二時に実行されます。", "cp932"),
    ("日本語のテキストです", "euc_jp"),                                   # not taken for Big5
    ("Größe naïve", "latin-1"), ("Café crème brûlée", "cp1252"),          # not taken for Big5 / Hangul
    ("Съешь же ещё этих мягких французских булок, да выпей чаю.", "cp1251"), ("Καλημέρα κόσμε", "cp1253"),
])
def test_other_texts_are_read_as_before(text, codec):
    assert decode_text(text.encode(codec)) == text


@pytest.fixture(scope="module")
def srv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(tmp_path_factory.mktemp("kbenc")) as st:
        yield st


def run(st: ServerThread, capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["--host", st.addr[0], "--port", str(st.addr[1]), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("text, codec, query", [
    ("机房温度：41℃，空调——故障", "gbk", "空调故障"),
    ("備份失敗：磁碟已滿，請清理 /var/log。", "big5", "磁碟已滿"),
    ("백업 실패: 디스크가 가득 찼습니다", "euc-kr", "디스크가"),
])
def test_an_uploaded_short_note_is_found_by_its_words(srv, capsys, tmp_path, text, codec, query):
    note = tmp_path / f"note_{codec}.txt"
    note.write_bytes(text.encode(codec))
    code, out, err = run(srv, capsys, "kb", "upload", str(note), "--json")
    assert code == 0, err
    [doc] = json.loads(out)["files"]
    code, out, err = run(srv, capsys, "kb", "search", query, "--limit", "5", "--json")
    assert code == 0, err
    texts = [h["text"] for h in json.loads(out)["hits"] if h["doc_id"] == doc["doc_id"]]
    assert texts == [text]


@pytest.mark.parametrize("line, codec", [("백업 실패: 디스크가 가득 찼습니다\n", "euc-kr"),
                                         ("机房温度：41℃，空调——故障\n", "gbk"),
                                         ("備份失敗：磁碟已滿，請清理 /var/log。\n", "big5")])
def test_a_large_file_is_judged_on_its_head_and_decoded_whole(line, codec):
    data = (line * (6 * encodings.SAMPLE_CHARS // len(line))).encode(codec)
    assert len(data) > 4 * encodings.SAMPLE_CHARS
    assert decode_text(data) == data.decode(codec)

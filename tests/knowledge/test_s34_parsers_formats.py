"""Stop 34, parsers: YAML read as parser events (application tags accepted, memory flat, a single
big document cancellable, bounded in events), JSON bounded in values before it is parsed and
pretty-printed from its text, a csv quote never closed refused with its line, Excel's ``sep=;``
line, owner-password-only pdfs read, config files and rotated logs accepted, ``.env`` refused."""
from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from kb_testlib import make_pdf
from server.errors import HandlerError
from server.knowledge import parsers
from server.knowledge.config import KnowledgeConfig
from server.knowledge.parsers import kind_of, parse

CFG = KnowledgeConfig()


def refused(name: str, data: bytes, cfg: KnowledgeConfig = CFG, cancelled=None) -> str:
    with pytest.raises(HandlerError) as e:
        parse(name, data, cfg, cancelled)
    assert e.value.code == "UNSUPPORTED_MEDIA", e.value.message
    return e.value.message


def peak_of(fn) -> int:
    """Bytes allocated at the peak while ``fn()`` runs (tracemalloc), the parsers' imports done."""
    parse("warm.yaml", b"a: [1]\n", CFG)
    parse("warm.json", b'{"a": [1]}', CFG)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# -- YAML ------------------------------------------------------------------------------------------
CLOUDFORMATION = b"""AWSTemplateFormatVersion: "2010-09-09"
Resources:
  BackupBucket:
    Type: AWS::S3::Bucket
    Properties:
      BucketName: !Sub "${AWS::StackName}-backups-walrus"
      Tags: !Ref BackupTags
secret: !vault |
  $ANSIBLE_VAULT;1.1;AES256
  6231
password: !secret db_password
test:
  script:
    - !reference [.setup, script]
"""


def test_yaml_with_application_tags_is_accepted_as_written():
    blocks = parse("stack.yaml", CLOUDFORMATION, CFG)
    text = "\n".join(b.text for b in blocks)
    assert "!Sub \"${AWS::StackName}-backups-walrus\"" in text and "!reference [.setup, script]" in text
    assert blocks[0].line_start == 1


def test_yaml_syntax_errors_and_python_tags_are_still_refused():
    assert "malformed yaml" in refused("c.yml", b"a: [1, 2\n")
    assert "malformed yaml" in refused("c.yml", b"!!python/object/apply:os.system ['true']\n")
    assert "python/name:os.system" in refused("c.yml", b"a: !!python/name:os.system ''\n")
    assert "undefined alias 'nope'" in refused("c.yml", b"a: &x 1\nb: *nope\n")
    assert parse("c.yml", b"a: &x 1\nb: *x\n---\nc: &x 2\nd: *x\n", CFG)          # anchors per document


def test_yaml_nesting_is_bounded(monkeypatch):
    monkeypatch.setattr(parsers, "YAML_MAX_DEPTH", 50)
    assert parse("ok.yaml", b"[" * 50 + b"]" * 50, CFG)
    assert "nested too deeply" in refused("deep.yaml", b"[" * 51 + b"]" * 51)


def test_yaml_events_are_bounded(monkeypatch):
    monkeypatch.setattr(parsers, "YAML_MAX_EVENTS", 10_000)
    data = b"- {}\n" * 6_000                                   # 12,002 events with the stream's and document's
    assert "YAML_MAX_EVENTS" in refused("many.yaml", data)
    assert parse("some.yaml", b"- {}\n" * 4_000, CFG)


def test_one_big_yaml_document_is_polled_for_cancellation_while_it_is_read():
    """Before, the budget was checked only between documents: one big document (4 MB) could not
    be cancelled (SIGTERM took 33 s against a grace of 5 s)."""
    items = 50_000
    data = b"- {}\n" * items                                  # one document, one paragraph
    polls = [0]

    def cancelled() -> bool:
        polls[0] += 1
        return False

    assert parse("list.yaml", data, CFG, cancelled)
    assert polls[0] >= 2 * items // parsers.YAML_CHECK_EVERY          # every YAML_CHECK_EVERY events
    polls[0] = 0
    stop_at = 3

    def stop() -> bool:
        polls[0] += 1
        return polls[0] >= stop_at

    with pytest.raises(HandlerError) as e:
        parse("list.yaml", data, CFG, stop)
    assert e.value.code == "SHUTTING_DOWN" and polls[0] == stop_at


def test_yaml_is_validated_without_building_its_objects():
    """A one-line flow list of 30,000 mappings: safe_load_all built them all (a 4 MB file: RSS
    87 -> 922 MB); read as events, the peak stays a small multiple of the file."""
    data = b"[" + b"{}, " * 30_000 + b"{}]\n"
    import yaml
    peak = peak_of(lambda: parse("flow.yaml", data, CFG))
    bound = 4 if getattr(yaml, "__with_libyaml__", False) else 8   # (the pure-Python parser keeps more)
    assert peak < bound * len(data), peak             # safe_load_all: ~250 times


# -- JSON ------------------------------------------------------------------------------------------
def test_json_over_the_value_limit_is_refused_before_it_is_parsed(monkeypatch):
    """10 MB of ``[{},{},...]`` took RSS 111 -> 1,403 MB over 35 s, then was refused for its
    chunks; now the values are counted first and the file refused at about its own size."""
    assert parsers.JSON_MAX_VALUES == 10_000_000                     # the default (docs/knowledge.md)
    monkeypatch.setattr(parsers, "JSON_MAX_VALUES", 200_000)
    n = parsers.JSON_MAX_VALUES + 10
    data = b"[" + b"{}," * n + b"{}]"
    holder = {}

    def run() -> None:
        holder["message"] = refused("dicts.json", data)
    peak = peak_of(run)
    assert "JSON_MAX_VALUES" in holder["message"] and f"{n + 2} values" in holder["message"]
    assert peak < 3 * len(data), peak


def test_json_value_count_leaves_strings_and_empty_containers_out(monkeypatch):
    monkeypatch.setattr(parsers, "JSON_MAX_VALUES", 6)
    assert parsers._json_values('{"a": [1, 2, {"b,[{": []}], "c": {}}') == 7     # object, a, c, 1, 2, {..}, b
    assert parse("ok.json", b'{"a": "x,y,z,[,{", "b": [[], {}, 3]}', CFG)        # 6 values
    assert "7 values" in refused("no.json", b'{"a": [1, 2, 3, 4, 5]}')


def test_one_line_json_is_pretty_printed_without_its_tree():
    """Pretty-printed from its text, as json.dumps(indent=2) would print it (escapes decoded), in a
    small multiple of the file's size: before, the tree and every iterencode piece were held."""
    records = [{"host": f"web-{i:05d}", "zh": "\u4e2d\u6587", "port": 8080 + i % 10, "tags": ["a", "b"],
                "ok": True, "none": None, "f": 1.5, "empty": {}} for i in range(5_000)]
    data = json.dumps(records, separators=(",", ":")).encode()               # ascii, with \\u escapes
    out = {}
    peak = peak_of(lambda: out.setdefault("blocks", parse("records.json", data, CFG)))
    [block] = out["blocks"]
    assert block.text == json.dumps(records, ensure_ascii=False, indent=2)
    assert (block.line_start, block.line_end) == (1, 1)
    assert peak < 12 * len(data), peak       # 7 (its text is 870 K characters in UCS-2); before, 22
    data = json.dumps([{"host": f"web-{i:05d}", "port": i, "tags": ["a", "b"]} for i in range(5_000)],
                      separators=(",", ":")).encode()
    peak = peak_of(lambda: out.update(blocks=parse("hosts.json", data, CFG)))
    assert out["blocks"][0].text == json.dumps(json.loads(data), indent=2)
    assert peak < 8 * len(data), peak        # 5; before, 26


def test_one_line_json_pretty_printing_is_polled_and_counted():
    data = b"[" + b"[1,2,3]," * 5_000 + b"[]]"
    polls = [0]

    def cancelled() -> bool:
        polls[0] += 1
        return False

    parse("lists.json", data, CFG, cancelled)
    assert polls[0] >= 20_000 // parsers.JSON_CHECK_EVERY
    message = refused("lists.json", data, KnowledgeConfig(max_extracted_chars=50_000))
    assert "max_extracted_chars" in message


def test_json_lone_surrogate_and_multiline_files_unchanged():
    [b] = parse("s.json", b'{"k": "\\ud800x", "zh": "\\u4e2d"}', CFG)
    assert b.text == '{\n  "k": "\\ud800x",\n  "zh": "\u4e2d"\n}'
    blocks = parse("m.json", b'{\n  "a": 1,\n\n  "b": "\\u4e2d"\n}\n', CFG)
    assert [(x.text, x.line_start, x.line_end) for x in blocks] == [('{\n  "a": 1,', 1, 2),
                                                                   ('"b": "\\u4e2d"\n}', 4, 5)]
    assert "malformed json" in refused("bad.json", b'{"a": [1, 2}')


# -- CSV -------------------------------------------------------------------------------------------
STRAY = "host,ip,note\n" + "".join(
    f'srv{i},10.2.0.{i},{chr(34) + "quoted start but never closed" if i == 3 else f"row note {i}"}\n'
    for i in range(1, 41))


def test_csv_quote_never_closed_is_refused_naming_its_line():
    """Before, rows 3-40 became one cell, silently, and a search for srv30 found nothing."""
    message = refused("stray.csv", STRAY.encode())
    assert "malformed csv" in message and "line 4" in message and "never closed" in message


@pytest.mark.parametrize("text, line", [
    ('a,b\n1,2\n3,"y\n', 3),
    ('a,b\n1,"two\nlines"\n2,"x""\n', 4),               # a doubled quote at the end is escaped: still open
    ('a,b\n1,"two\nlines",3,"open\n', 3),                # in a record spanning lines: the line of its quote
    ('a;b\r\n1;"x\r\n2;3\r\n', 2),
])
def test_csv_open_quote_line(text, line):
    assert f"line {line} " in refused("q.csv", text.encode())


@pytest.mark.parametrize("text", [
    'a,b\n1,ab"c\n',                                    # a quote inside a cell is literal
    'a,b\n1,"x"y"z\n2,3\n',                             # after the closing quote the cell runs on
    'a,b\n1,"multi\nline ""quoted"" note"\n',
    'a,b\n1,""\n',
    'a,b\n1,"x"\n\n\n',
])
def test_csv_closed_quotes_are_read(text):
    assert parse("ok.csv", text.encode(), CFG)


def test_excel_sep_line_names_the_delimiter_and_is_not_the_header():
    blocks = parse("x.csv", b"sep=;\r\nhost;ip;role\r\nalpha;1.1.1.1;web,front\r\n", CFG)
    assert [(b.text, b.line_start, b.line_end) for b in blocks] == [
        ("host: alpha; ip: 1.1.1.1; role: web,front", 3, 3)]
    blocks = parse("t.csv", "sep=\t\nhost\tip\n主机\t2.2.2.2\n".encode("utf-16"), CFG)
    assert [(b.text, b.line_start) for b in blocks] == [("host: 主机; ip: 2.2.2.2", 3)]
    assert "line 3 " in refused("q.csv", b'sep=,\nhost,note\nx,"open\ny,z\n')


# -- PDF -------------------------------------------------------------------------------------------
def _encrypted(user: str, owner: str, algorithm: str = "RC4-128") -> bytes:
    from pypdf import PdfReader, PdfWriter
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(["Backups run nightly on bk-09"]))))
    writer.encrypt(user_password=user, owner_password=owner, algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_owner_password_only_pdf_is_read_and_a_user_password_refused():
    [block] = parse("owner.pdf", _encrypted("", "owner-secret"), CFG)
    assert block.text == "Backups run nightly on bk-09" and block.page == 1
    message = refused("locked.pdf", _encrypted("user-secret", "owner-secret"))
    assert message.startswith("password-protected pdf")


@pytest.mark.parametrize("algorithm", ["AES-128", "AES-256"])
def test_an_aes_pdf_with_only_an_owner_password_is_read(algorithm):
    """Acrobat's usual ciphers: pypdf opens them with the cryptography package (the pypdf[crypto] extra)."""
    [block] = parse("aes.pdf", _encrypted("", "owner-secret", algorithm), CFG)
    assert block.text == "Backups run nightly on bk-09"
    assert refused("aes-locked.pdf", _encrypted("user-secret", "owner-secret", algorithm)).startswith(
        "password-protected pdf")


def test_pdf_cipher_the_server_cannot_decrypt_is_named(monkeypatch):
    from pypdf import PdfReader
    from pypdf.errors import DependencyError

    def needs_aes(self, password):
        raise DependencyError("cryptography>=3.1 is required for AES algorithm")
    monkeypatch.setattr(PdfReader, "decrypt", needs_aes)
    message = refused("aes.pdf", _encrypted("", "owner-secret"))
    assert "cannot decrypt" in message and "cryptography" in message


# -- file types ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["nginx.conf", "app.ini", "setup.cfg", "pyproject.toml", "app.properties",
                                  "app.log.1", "syslog.LOG.12", "dir/x.log.3"])
def test_config_files_and_rotated_logs_are_text(name):
    assert kind_of(name) == "text"
    [block] = parse(name, b"[database]\nhost = db-7  # marker-ibis\n", CFG)
    assert block.text == "[database]\nhost = db-7  # marker-ibis" and (block.line_start, block.line_end) == (1, 2)


@pytest.mark.parametrize("name", [".env", ".env.local", ".ENV.production", "prod.env", "x/.env"])
def test_env_files_are_refused_for_their_secrets(name):
    message = refused(name, b"API_KEY=sk-live-123\n")
    assert "environment file" in message and "secrets" in message


@pytest.mark.parametrize("name", ["app.log.1.gz", "app.log.x", "environment", "a.envelope"])
def test_other_names_stay_unsupported(name):
    assert "unsupported file type" in refused(name, b"x\n")


def test_yaml_without_libyaml_reads_the_same(monkeypatch):
    import yaml
    monkeypatch.delattr(yaml, "CSafeLoader", raising=False)
    assert "!reference [.setup, script]" in "\n".join(b.text for b in parse("stack.yaml", CLOUDFORMATION, CFG))
    assert "malformed yaml" in refused("c.yml", b"a: [1, 2\n")
    assert "undefined alias" in refused("c.yml", b"b: *nope\n")
    assert "malformed yaml" in refused("c.yml", b"a: \x07\n")                # a control character


def test_a_data_dump_of_millions_of_numbers_is_read_with_little_memory():
    """A 4 MB multi-line array of 2.1 M numbers (a metrics export) was refused over the old limit of 2 M
    values; validation now keeps no number, so it is read, holding about 8 bytes a value."""
    data = (b"[\n" + b"".join(b"%s,\n" % b",".join(b"7" for _ in range(100)) for _ in range(21_000))
            + b"1]\n")
    holder = {}
    peak = peak_of(lambda: holder.setdefault("blocks", parse("series.json", data, CFG)))
    assert holder["blocks"] and peak < 12 * len(data), peak

"""The text encoding of an uploaded text file, detected: bytes in, ``str`` out (``decode_text``).

BOM / UTF-8 first (a cut last character and a handful of invalid bytes tolerated), then Shift-JIS
when it reads as Japanese, then GB18030, Big5 or EUC-KR when it reads as Chinese or Korean (the
reading with the most common characters), else charset-normalizer's guess (Latin-1's cp1252
preferred among equally clean guesses; a short file's Thai/katakana/Hangul guess replaced by a
GB18030/Big5 reading of common hanzi); UTF-16 without a BOM is recognised by its
NUL bytes (every other byte 0). ANSI escape sequences (a coloured log's ``\x1b[32m``) are removed.
Binary content (NUL bytes, control characters) is refused with UNSUPPORTED_MEDIA. docs/knowledge.md
"Formats" gives the thresholds.
"""
from __future__ import annotations

import codecs
import re

from protocol import ErrorCode
from server.errors import HandlerError

_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
#: ANSI escape sequences, as terminals and coloured logs write them: CSI ("\x1b[32m", "\x1b[0K") and
#: OSC ("\x1b]0;title\x07", "\x1b]8;;url\x1b\\"), an OSC never across a line end (line numbers stay)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b\n]*(?:\x07|\x1b\\)")
UTF16_SAMPLE_BYTES = 4096     # bytes examined for the NUL pattern of UTF-16 without a BOM
UTF16_NUL_RATIO = 4           # ... NUL bytes at one parity more than this many times those at the other


def unsupported(message: str) -> HandlerError:
    """The refusal of a file the knowledge base cannot read (UNSUPPORTED_MEDIA), for every parser."""
    return HandlerError(ErrorCode.UNSUPPORTED_MEDIA, message)


#: the share of a reading's non-ASCII characters that must be native to its script (``_is_chinese``
#: for GB18030 and Big5, ``_is_korean`` for EUC-KR/cp949) for the bytes to be taken as that encoding
CJK_NATIVE_SHARE = 0.9
#: at most this share of a GB18030 reading's characters may have an ASCII second byte (Latin-1 text
#: read as GBK pairs an accent with the next letter; GB2312 never has one)
GB_ASCII_TRAIL_MAX_SHARE = 0.2
#: a file of at most this many bytes whose charset-normalizer guess is implausible (``_implausible``)
#: is read as GB18030 or Big5 instead when that reading is plausible Chinese (``_rescue_cjk``)
CJK_RESCUE_MAX_BYTES = 4096
#: a Big5 reading (before charset-normalizer) or a GB18030/Big5 reading replacing an implausible guess
#: must have at least this share of common hanzi among its ideographs (EUC-JP Japanese and Latin-1
#: read as Big5 give mostly rare ones; real Chinese prose 60-95%)
CJK_COMMON_SHARE = 0.4
#: ... implausible: at least this share of the guess's non-ASCII characters are Thai, half-width
#: katakana, Hangul or Yi (what GBK and Big5 bytes come out as under cp874, cp932, cp949, UTF-16)
IMPLAUSIBLE_SHARE = 0.5

# Common characters, to choose between the readings of double-byte text (GB18030, Big5, EUC-KR/cp949
# all decode much the same bytes): real text is mostly made of its language's common characters, a
# wrong reading of it of rare ones. Hanzi: the most frequent simplified characters and the
# traditional forms of those that differ, with the words of operations notes; Hangul: frequent
# syllables. Not exhaustive: only the counts of two readings of the same bytes are compared.
_COMMON_HANZI_SIMPLIFIED = (
    "的一是不了在人有我他这个们中来上大为和国地到以说时要就出会可也你对生能而子那得于着下自之年过发后"
    "作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心她本前开但因"
    "只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应"
    "战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿"
    "原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太"
    "量再感建务做接必场件计管期市直德资命山金指克许统区保至队形社便空决治展马科司五基眼书非则听白却界"
    "达光放强即像难且权思王象完设式色路记南品住告类求据程北边死张该交规万取拉格望觉术领共确传师观清今"
    "切院让识候带导争运笑飞风步改收根干造言联持组每济车亲极林服快办议往元英士证近失转夫令准布始怎呢存"
    "未远叫台单影具罗字爱击流备兵连调深商算质团集百需价花党华城石级整府离况亚请技际约示复病息究线似官"
    "火断精满支视消越器容照须九增研写称企八功吗包片史委乎查轻易早曾除农找装广显吧阿李标谈吃图念六引历"
    "首医局突专费号尽另周较注语仅考落青随选列武红响虽推势参希古众构房半节土投某案黑维革划敢微份库磁盘"
    "网络端配置志录恢超钟秒错误警监控检启停止执脚户密码限登账版升署环境测试群储删创修读访败异故障骤负"
    "责值班邮册档审批申宽延迟载均衡缓状态温湿源硬软址域凌晨午晚零杭州京圳架换防墙策略混禁勿留卡核驱序"
    "编译站页浏览客云虚拟镜例额熔降迁移滚灾双丢抖宕挂掉崩溃泄漏占释扩缩湾暖季频繁居喜欢喝茶尤乌龙夜潮"
    "夏"
)
_COMMON_HANZI_TRADITIONAL = (
    "這個們來為會說時對後過發裡與當動點長門問間關頭體聽見視覺讓識認議論語請讀誰課談講記設計該話應實現"
    "經總統務員業產樂書畫車轉輕輸連運還進遠選達邊類題頁風飛馬驗種麼學沒開從軍無機戰製東聲條氣處義傳師"
    "觀導爭聯組濟親極證準單羅愛擊備調質團價黨華級離況亞際約復線斷滿須稱嗎歷醫費號盡較僅紅響雖勢參眾構"
    "節劃萬場區隊決張規領確廣顯圖標農裝專數據庫錄帳權碼戶啟執腳測試叢儲刪訪敗異責絡郵冊檔審溫濕電軟網"
    "憑週兩鐘櫃換牆則輪替資料逾檢碟誌憶錯誤監環寫結驟負繫頻寬遲載佇訊狀態註驅編譯瀏覽雲虛擬鏡額遷滾災"
    "雙複丟潰洩佔釋擴縮於灣臺歡烏龍颱"
)
_COMMON_HANGUL = (
    "이다는의에하고을가를지서한기로사리자도니시어대정수아인일습해나그보있들것주상부전제적장게요라구원"
    "동성마우되면국으만스과생내화계분관위신세말경개문무공비행년때중소학여후물업방연같음안두트치명실회"
    "발통데결선터야식점히거저목모미조교바산유받호영없심오체단번알드래변현당감러차건용운복설품각진님였"
    "므반량약람며타크더출권월료별간또배강파표입즉금직특력환외집합민필확최판준능백패디득찼버재작베초네"
    "워류메밀접속렉토완취삭추검색템애링림담락처근새벽매프포증암했할된될및등않희까죠려록께씩째쯤뿐럼겠"
    "았었십봐줘줄쓸쓰놓넣빼켜꺼끄열닫읽찾온청응답캐큐레폴름족허규칙책왜떻엇누언많좋쁘높낮빠느"
)
_COMMON_HANZI = frozenset(_COMMON_HANZI_SIMPLIFIED + _COMMON_HANZI_TRADITIONAL)
_COMMON_HANGUL_SET = frozenset(_COMMON_HANGUL)


def _is_cjk_mark(c: str) -> bool:
    """Punctuation and symbols that GB2312/Big5/KS X 1001 text is written with: CJK symbols and
    punctuation (、。「」), full-width forms (，：！８), general punctuation (—— …… “” ‘’ ‰ ※ ·),
    letterlike symbols, number forms, arrows, mathematical operators, technical symbols and
    enclosed alphanumerics U+2100-U+24FF (℃ № Ⅻ → ≤ ① ⑴), and · × ÷ ° ±."""
    o = ord(c)
    return (0x3000 <= o <= 0x303F or 0xFF01 <= o <= 0xFF5E or 0x2010 <= o <= 0x206F or 0x2100 <= o <= 0x24FF
            or c in "\u00b7\u00d7\u00f7\u00b0\u00b1")


def _is_chinese(c: str) -> bool:
    """A CJK ideograph (the unified block or extension A) or a mark Chinese text uses (``_is_cjk_mark``)."""
    return "\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" or _is_cjk_mark(c)


def _is_korean(c: str) -> bool:
    """A Hangul syllable or compatibility jamo, or a mark Korean text uses (``_is_cjk_mark``)."""
    return "\uac00" <= c <= "\ud7a3" or "\u3130" <= c <= "\u318f" or _is_cjk_mark(c)


def _common(text: str, korean: bool = False) -> int:
    """How many characters of ``text`` (its first ``SAMPLE_CHARS``) are common hanzi (or, ``korean``,
    common Hangul syllables)."""
    common = _COMMON_HANGUL_SET if korean else _COMMON_HANZI
    return sum(1 for c in text[:SAMPLE_CHARS] if c in common)


def _mostly_common_hanzi(text: str) -> bool:
    """At least ``CJK_COMMON_SHARE`` of the ideographs of ``text`` (its first ``SAMPLE_CHARS``) are common."""
    ideographs = sum(1 for c in text[:SAMPLE_CHARS] if "\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf")
    return ideographs > 0 and _common(text) >= CJK_COMMON_SHARE * ideographs


def _ascii_trail_ok(text: str, encoding: str) -> bool:
    """At most ``GB_ASCII_TRAIL_MAX_SHARE`` of the non-ASCII characters of ``text`` (its first
    ``SAMPLE_CHARS``) are encoded in ``encoding`` with an ASCII second byte (none are in GB2312 or
    EUC-KR; Latin-1 text read as GBK or cp949 pairs an accent with the next letter)."""
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    trail = sum(1 for c in wide if (b := c.encode(encoding)) and len(b) == 2 and b[1] < 0x80)
    return trail <= GB_ASCII_TRAIL_MAX_SHARE * len(wide)


def _strict(data: bytes, encoding: str) -> str | None:
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        return None


def _as_gb18030(data: bytes) -> str | None:
    """``data`` as GB18030 (a superset of GBK and GB2312) when it decodes strictly and its non-ASCII
    characters are mostly Chinese (``CJK_NATIVE_SHARE``: CJK ideographs and the marks of
    ``_is_chinese``) and at most ``GB_ASCII_TRAIL_MAX_SHARE`` of them have an ASCII second byte (as
    in GB2312; Latin-1 text read as GBK pairs an accent with the next letter), else None. The
    proportions are taken on the first ``SAMPLE_CHARS`` characters."""
    text = _as_native(data, "gb18030", _is_chinese)
    return text if text is not None and _ascii_trail_ok(text, "gb18030") else None


def _as_native(data: bytes, encoding: str, native) -> str | None:
    """``data`` as ``encoding`` when it decodes strictly and at least ``CJK_NATIVE_SHARE`` of its
    non-ASCII characters (of the first ``SAMPLE_CHARS``) are ``native``, else None. Those are judged
    on the first ``4 * SAMPLE_CHARS`` bytes first: a large file is decoded whole only in the
    encodings it may be in."""
    head = data[:4 * SAMPLE_CHARS]                   # (at least SAMPLE_CHARS characters, at most 4 bytes each)
    try:
        text = codecs.getincrementaldecoder(encoding)().decode(head, final=len(head) == len(data))
    except UnicodeDecodeError:
        return None
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    if not wide or sum(1 for c in wide if native(c)) < CJK_NATIVE_SHARE * len(wide):
        return None
    return text if len(head) == len(data) else _strict(data, encoding)


def _as_cjk(data: bytes) -> str | None:
    """``data`` as Chinese or Korean when one of its strict readings is native to its script
    (``CJK_NATIVE_SHARE``): GB18030 (``_as_gb18030``), Big5 (or cp950) with mostly common hanzi
    (``CJK_COMMON_SHARE``), EUC-KR/cp949 with few ASCII second bytes (``GB_ASCII_TRAIL_MAX_SHARE``);
    else None. The same double-byte text often reads as more than one (Korean as rare hanzi in GBK,
    a short GBK note as Hangul): the reading with the most common characters wins, GB18030 first on
    a tie, then Big5. Checked before charset-normalizer, whose guess on short Chinese text is often
    Thai (cp874), half-width katakana (cp932) or the wrong one of GBK/Big5."""
    gb = _as_gb18030(data)
    big5 = _as_native(data, "big5", _is_chinese) or _as_native(data, "cp950", _is_chinese)
    if big5 is not None and not _mostly_common_hanzi(big5):
        big5 = None
    korean = _as_native(data, "cp949", _is_korean)
    if korean is not None and not _ascii_trail_ok(korean, "cp949"):
        korean = None
    readings = [(_common(t, rank == 2), -rank, t) for rank, t in enumerate((gb, big5, korean)) if t is not None]
    return max(readings)[2] if readings else None


def _implausible(text: str) -> bool:
    """Whether ``text`` is what double-byte Chinese reads as in a wrong single- or double-byte
    encoding: at least ``IMPLAUSIBLE_SHARE`` of its non-ASCII characters Thai, half-width katakana,
    Hangul or Yi syllables."""
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    odd = sum(1 for c in wide if "\u0e00" <= c <= "\u0e7f" or "\uff61" <= c <= "\uff9f" or "\uac00" <= c <= "\ud7a3"
              or "\ua000" <= c <= "\ua4cf")
    return bool(wide) and odd >= IMPLAUSIBLE_SHARE * len(wide)


def _rescue_cjk(data: bytes, guessed: str) -> str:
    """charset-normalizer's guess ``guessed``; but for a short file (``CJK_RESCUE_MAX_BYTES``) whose
    guess is implausible (``_implausible``), its strict GB18030 or Big5 reading with mostly common
    hanzi (``CJK_COMMON_SHARE``), the one with more of them."""
    if len(data) > CJK_RESCUE_MAX_BYTES or not _implausible(guessed):
        return guessed
    readings = [(_common(t), -rank, t) for rank, enc in enumerate(("gb18030", "big5", "cp950"))
                if (t := _strict(data, enc)) is not None and _mostly_common_hanzi(t)]
    return max(readings)[2] if readings else guessed


def _as_shift_jis(data: bytes) -> str | None:
    """``data`` as Shift-JIS (cp932) when it decodes strictly and at least a fifth of its non-ASCII
    characters are kana: Japanese prose always has kana (particles, endings), while GBK Chinese read
    as cp932 gives kanji and half-width katakana, almost never full-width kana. Checked before the
    GB18030 step, which would otherwise read Shift-JIS as rare ideographs."""
    try:
        text = data.decode("cp932")
    except UnicodeDecodeError:
        return None
    wide = [c for c in text[:SAMPLE_CHARS] if ord(c) > 0x7F]
    kana = sum(1 for c in wide if "\u3040" <= c <= "\u30ff")
    halfwidth = sum(1 for c in wide if "\uff61" <= c <= "\uff9f")
    return text if wide and kana >= 0.2 * len(wide) and halfwidth <= 0.05 * len(wide) else None


SAMPLE_CHARS = 65536      # characters examined by the encoding heuristics
UTF8_MAX_BAD = 8          # invalid sequences tolerated in otherwise valid UTF-8 (replaced by U+FFFD)


def _as_utf8(data: bytes) -> str | None:
    """``data`` as UTF-8 that is valid but for an incomplete last character (a file cut short: the
    tail is dropped) and at most ``UTF8_MAX_BAD`` invalid sequences (each replaced by U+FFFD) among
    at least four times as many valid non-ASCII characters; else None."""
    view = memoryview(data)
    if data.startswith(b"\xef\xbb\xbf"):
        view = view[3:]
    parts: list[str] = []
    bad = pos = 0
    while True:
        try:
            parts.append(str(view[pos:], "utf-8"))
            break
        except UnicodeDecodeError as exc:
            parts.append(str(view[pos:pos + exc.start], "utf-8"))
            if pos + exc.end == len(view) and exc.reason == "unexpected end of data":
                break                                  # the last character, cut short
            bad += 1
            if bad > UTF8_MAX_BAD:
                return None
            parts.append("\ufffd")
            pos += exc.end
    text = "".join(parts)
    if bad and sum(1 for c in text if ord(c) > 0x7F) - bad < 4 * bad:
        return None
    return text


_WESTERN = {"cp1252", "latin_1", "iso8859_15"}


def _guess(data: bytes) -> str | None:
    """charset-normalizer's best guess; but cp1252 (Latin-1's superset) when it is among the guesses
    that read the bytes equally cleanly (the lowest "mess"), so French or German text is not read
    as cp1250 or hp_roman8 only because those rank first among equals."""
    from charset_normalizer import from_bytes
    matches = from_bytes(data)
    best = matches.best()
    if best is None:
        return None
    lowest = min(m.chaos for m in matches)
    for m in matches:
        if m.chaos <= lowest and _WESTERN & {m.encoding, *m.could_be_from_charset}:
            try:
                return data.decode("cp1252")
            except UnicodeDecodeError:
                return data.decode("latin-1")
    return str(best)


def _utf16_without_bom(data: bytes) -> str | None:
    """"utf-16-le" or "utf-16-be" when ``data`` (no BOM) has UTF-16's NUL pattern: an even length and,
    in the first ``UTF16_SAMPLE_BYTES``, NUL bytes on one side of the 2-byte units (the high byte of
    an ASCII character: "a\\0b\\0" in UTF-16-LE, even a newline in Chinese text) more than
    ``UTF16_NUL_RATIO`` times as often as on the other (the low byte of U+xx00, such as 一 U+4E00),
    else None. Binary data that happens to match decodes to control characters and is refused by
    the usual check."""
    if len(data) < 2 or len(data) % 2:
        return None
    sample = data[:UTF16_SAMPLE_BYTES]
    low_first, high_first = sample[0::2].count(0), sample[1::2].count(0)   # (LE: the low byte first)
    if high_first > UTF16_NUL_RATIO * low_first:
        return "utf-16-le"
    if low_first > UTF16_NUL_RATIO * high_first:
        return "utf-16-be"
    return None


def decode_text(data: bytes) -> str:
    """Bytes of a text file as str: BOM / UTF-8 first (a cut last character and a handful of invalid
    bytes tolerated), UTF-16 without a BOM by its NUL pattern, then Shift-JIS when it reads as
    Japanese, then GB18030 / Big5 / EUC-KR when it reads as Chinese or Korean (``_as_cjk``), else
    the encoding charset-normalizer finds (UTF-16, Latin-1 preferred among equals, ...; an
    implausible guess on a short file replaced by ``_rescue_cjk``). ANSI escape sequences are removed; binary
    content (NUL bytes, control characters) is refused."""
    utf16 = data.startswith((b"\xff\xfe", b"\xfe\xff"))
    bare16 = None if utf16 else _utf16_without_bom(data)
    if bare16 is not None:
        try:
            text = data.decode(bare16)
        except UnicodeDecodeError:              # (a lone surrogate: not text)
            raise unsupported("binary content in a text file") from None
    elif b"\x00" in data[:65536] and not utf16:
        raise unsupported("binary content in a text file")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = None if utf16 else (_as_utf8(data) or _as_shift_jis(data) or _as_cjk(data))
            if text is None:
                text = _guess(data)
                if text is None:
                    raise unsupported("cannot detect the text encoding (binary file?)") from None
                if not utf16:
                    text = _rescue_cjk(data, text)
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    sample = text[:65536]
    if sample and len(_CONTROL.findall(sample)) > len(sample) // 100 + 1:
        raise unsupported("binary content in a text file")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text

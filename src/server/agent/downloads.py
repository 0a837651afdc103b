"""Offline download requests, in Chinese and English: "下载 <name>", "download <name>", "send me <name>".

``parse_download_request`` gives the ``offer_download`` tool's arguments (a 24-hex-digit word is a
document id, anything else a file name or a part of one); "send me" needs a file-like name (with an
extension, or quoted) so "send me the cpu usage" stays a system question. ``render`` writes the answer
from the tool's result: the offer was sent, or why not.
"""
from __future__ import annotations

import re
from typing import Any

_QUOTE = "\"'“”‘’`「」《》"
_DOWNLOAD = [
    re.compile(r"^\s*(?:请|帮我|给我)?\s*下载(?:一下)?(?:文件|文档)?\s*[:：]?\s*(?P<name>.+?)\s*[。.!！?？]*\s*$"),
    re.compile(r"^\s*(?:please\s+)?download\s+(?:the\s+)?(?:file\s+|document\s+)?(?P<name>.+?)\s*[.!?]*\s*$",
               re.IGNORECASE),
    re.compile(r"^\s*(?:please\s+)?send\s+me\s+(?:the\s+)?(?:file\s+|document\s+)?(?P<name>.+?)\s*[.!?]*\s*$",
               re.IGNORECASE),
]
_FILE_LIKE = re.compile(r"^[^\s/\\]+\.[A-Za-z0-9]{1,8}$")
_DOC_ID = re.compile(r"^[0-9a-f]{24}$")
MAX_REQUEST_CHARS = 300


def parse_download_request(text: str) -> dict[str, Any] | None:
    """``{"doc_id": ...}`` or ``{"name": ...}`` for a download request, else None."""
    if len(text) > MAX_REQUEST_CHARS:
        return None
    for i, pat in enumerate(_DOWNLOAD):
        m = pat.match(text)
        if not m:
            continue
        raw = m.group("name").strip()
        quoted = len(raw) > 1 and raw[0] in _QUOTE and raw[-1] in _QUOTE
        name = raw.strip(_QUOTE).strip()
        if not name:
            return None
        if i == 2 and not quoted and not _FILE_LIKE.match(name):
            return None                  # "send me the cpu usage": not a file
        return {"doc_id": name} if _DOC_ID.match(name) else {"name": name[:255]}
    return None


def render(d: dict[str, Any], zh: bool) -> str:
    name, size = d.get("filename", "?"), d.get("size", 0)
    if zh:
        return f"已向你的客户端发送下载：{name}（{size} 字节，MD5 {d.get('md5', '')}）。"
    return f"Sent {name} ({size} bytes, MD5 {d.get('md5', '')}) to your client for download."

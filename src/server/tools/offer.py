"""offer_download: the assistant offers one of the user's knowledge-base documents to the user's client.

The tool only names the document (``doc_id`` or ``name``); the server's offer service
(server.offers) checks that the user may read it and sends the offer to the client that asked
(a v2 client gets DOWNLOAD_OFFER and the bytes over UDP, a v3 client a DOWNLOAD_OFFER_V3 event).
It changes nothing on the server.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from server.errors import HandlerError
from server.tools.schema import ArgumentError
from server.tools.units import ToolFailure

# offer(user_id, session_id, doc_id, name) -> {"doc_id", "filename", "size", "md5", "via", "offered_to"}
OfferFn = Callable[[str, "str | None", "str | None", "str | None"], Awaitable[dict[str, Any]]]

DESCRIPTION = ("Offer one of the user's knowledge-base documents for download: the user's client receives it "
               "(by doc_id, or by file name). Use it when the user asks to download or be sent a document.")

OFFER_DOWNLOAD_SCHEMA = {
    "type": "object",
    "properties": {
        "doc_id": {"type": "string", "minLength": 1, "maxLength": 64,
                   "description": "The document's id (from the knowledge base)."},
        "name": {"type": "string", "minLength": 1, "maxLength": 255,
                 "description": "The document's file name, or a unique part of it, when the id is unknown."},
    },
    "additionalProperties": False,
}


async def offer_download(offer: OfferFn | None, args: dict[str, Any], user_id: str,
                         session_id: str | None) -> dict[str, Any]:
    if offer is None:
        raise ToolFailure("downloads are unavailable on this server")
    if not args.get("doc_id") and not args.get("name"):
        raise ArgumentError("give 'doc_id' or 'name' of the document to offer")
    try:
        return await offer(user_id, session_id, args.get("doc_id"), args.get("name"))
    except HandlerError as exc:
        raise ToolFailure(f"{exc.message} ({exc.code})") from None

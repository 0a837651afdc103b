"""Session ids and the file names derived from them.

Ids are server-generated: ``s_YYYYMMDD_<12 lowercase hex>`` (UTC creation day). Anything else is
rejected before it can reach a path. Files: ``session_YYYYMMDD_<session_id>.json`` (snapshot) and
``session_YYYYMMDD_<session_id>.journal`` beside it; the date is the one inside the id.
"""
from __future__ import annotations

import re
import secrets
from datetime import datetime, timezone

from .errors import InvalidSessionId

SESSION_ID_RE = re.compile(r"s_([0-9]{8})_[0-9a-f]{12}")
SNAPSHOT_RE = re.compile(r"session_([0-9]{8})_(s_[0-9]{8}_[0-9a-f]{12})\.json")
JOURNAL_RE = re.compile(r"session_([0-9]{8})_(s_[0-9]{8}_[0-9a-f]{12})\.journal")
SESSION_ID_LEN = 23


def new_session_id(now: datetime | None = None) -> str:
    """A fresh random session id for the current UTC day."""
    day = (now or datetime.now(timezone.utc)).strftime("%Y%m%d")
    return f"s_{day}_{secrets.token_hex(6)}"


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if well formed, else raise InvalidSessionId. Pure, safe inline."""
    if not isinstance(session_id, str):
        raise InvalidSessionId(f"invalid session id: expected a string, got {type(session_id).__name__}")
    if len(session_id) != SESSION_ID_LEN or SESSION_ID_RE.fullmatch(session_id) is None:
        shown = session_id if len(session_id) <= 40 else session_id[:40] + "..."
        raise InvalidSessionId(f"invalid session id {shown!r}: expected s_YYYYMMDD_<12 lowercase hex digits>")
    return session_id


def snapshot_name(session_id: str) -> str:
    return f"session_{session_id[2:10]}_{session_id}.json"


def journal_name(session_id: str) -> str:
    return f"session_{session_id[2:10]}_{session_id}.journal"

"""Session-date reasoning for recall: relative times in a query ("yesterday", "last Tuesday",
"3 days ago", "last week", "昨天", "前天", "上周二", "三天前") resolved against the time of the
question into the date terms every turn document carries (day, month name, year; see
``recall.date_terms``), so "what did we change on nginx yesterday" prefers yesterday's turns.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
ZH_WEEKDAYS = "一二三四五六日"
ZH_NUMBERS = {"一": 1, "两": 2, "二": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8, "九": 9, "十": 10}
MAX_DAYS_AGO = 366

#: the relative days a query may name (``referenced_days``; the offline history intent takes them out of a topic)
DAY_WORDS_EN = re.compile(r"\b(?:(today|tonight|this morning)|(yesterday)|(?:the )?day before yesterday|"
                 r"(\d{1,3}) days? ago|last (monday|tuesday|wednesday|thursday|friday|saturday|sunday)|"
                 r"(last week)|(\d{1,2}) weeks? ago)\b", re.IGNORECASE)
DAY_WORDS_ZH = re.compile(r"(今天|今早|今晚)|(昨天|昨晚)|(前天)|([0-9一两二三四五六七八九十]{1,3})天前|上(?:周|星期|礼拜)([一二三四五六日天])|"
                 r"(上周|上星期|上个星期)")


def _zh_number(text: str) -> int:
    if text.isdigit():
        return int(text)
    if text.startswith("十"):
        return 10 + ZH_NUMBERS.get(text[1:], 0) if len(text) > 1 else 10
    if len(text) == 2 and text[1] == "十":
        return ZH_NUMBERS.get(text[0], 1) * 10
    if len(text) == 3 and text[1] == "十":
        return ZH_NUMBERS.get(text[0], 1) * 10 + ZH_NUMBERS.get(text[2], 0)
    return ZH_NUMBERS.get(text, 0)


def _last_weekday(now: datetime, weekday: int) -> datetime:
    """The most recent ``weekday`` strictly before today's date."""
    back = (now.weekday() - weekday) % 7 or 7
    return now - timedelta(days=back)


def _previous_week(now: datetime) -> list[datetime]:
    start = now - timedelta(days=now.weekday() + 7)          # Monday of last week
    return [start + timedelta(days=i) for i in range(7)]


def referenced_days(query: str, now: datetime) -> list[datetime]:
    """The days a query refers to relative to ``now`` (in order of mention, without repeats)."""
    days: list[datetime] = []
    for m in DAY_WORDS_EN.finditer(query):
        today, yesterday, ago, weekday, last_week, weeks = m.groups()
        text = m.group(0).lower()
        if today:
            days.append(now)
        elif yesterday and "before" not in text:
            days.append(now - timedelta(days=1))
        elif "day before yesterday" in text:
            days.append(now - timedelta(days=2))
        elif ago and int(ago) <= MAX_DAYS_AGO:
            days.append(now - timedelta(days=int(ago)))
        elif weekday:
            days.append(_last_weekday(now, WEEKDAYS.index(weekday.lower())))
        elif last_week:
            days.extend(_previous_week(now))
        elif weeks:
            days.extend(now - timedelta(days=7 * int(weeks) + i) for i in range(-3, 4))
    for m in DAY_WORDS_ZH.finditer(query):
        today, yesterday, before_yesterday, ago, weekday, last_week = m.groups()
        if today:
            days.append(now)
        elif yesterday:
            days.append(now - timedelta(days=1))
        elif before_yesterday:
            days.append(now - timedelta(days=2))
        elif ago and 0 < _zh_number(ago) <= MAX_DAYS_AGO:
            days.append(now - timedelta(days=_zh_number(ago)))
        elif weekday:
            target = 6 if weekday in "日天" else ZH_WEEKDAYS.index(weekday)
            start = now - timedelta(days=now.weekday() + 7)
            days.append(start + timedelta(days=target))
        elif last_week:
            days.extend(_previous_week(now))
    seen: set[tuple[int, int, int]] = set()
    out = []
    for d in days:
        key = (d.year, d.month, d.day)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out

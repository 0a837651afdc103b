"""Text analysis for recall: English words (lowercased, stopwords removed, Porter-stemmed) plus CJK
character unigrams and bigrams, so one index serves English, Chinese and mixed text.

``analyze("My backups run nightly")   -> ["backup", "run", "nightli"]``
``analyze("备份服务器在杭州")          -> ["备", "份", "服", "务", "器", "杭", "州",
                                         "备份", "份服", "服务", "务器", "器在", "在杭", "杭州"]``
(CJK unigrams skip a short list of function characters; bigrams keep every pair.)
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from server.memory.stemmer import stem
from server.memory.tokens import CJK_CLASS

_CJK_RUN = f"[{CJK_CLASS}]+"
_LETTERS = rf"[^\W_{CJK_CLASS}]+"
_RUN_RE = re.compile(rf"({_CJK_RUN})|({_LETTERS}(?:['’]{_LETTERS})*)")
_HYPHENATED = re.compile(r"\b([a-z]+)-([a-z]+)\b")
CJK_PUNCT = re.compile(r"[\u3000-\u303f\uff00-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")

STOPWORDS = frozenset("""
a about above after again against all am an and any are aren't as at be because been before being
below between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down
during each few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here
here's hers herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself
let's me more most mustn't my myself no nor not of off on once only or other ought our ours ourselves
out over own same shan't she she'd she'll she's should shouldn't so some such than that that's the
their theirs them themselves then there there's these they they'd they'll they're they've this those
through to too under until up very was wasn't we we'd we'll we're we've were weren't what what's when
when's where where's which while who who's whom why why's with won't would wouldn't you you'd you'll
you're you've your yours yourself yourselves also just really yeah yes oh hey hi ok okay like get got
gonna wanna s t d ll m re ve
""".split())

# Informal chat forms -> the word a question is likely to use (both are indexed).
SYNONYMS = {
    "kid": "child", "kids": "children", "mom": "mother", "mum": "mother", "dad": "father",
    "biz": "business", "edu": "education", "pic": "photo", "pics": "photos", "picture": "photo",
    "pictures": "photos", "bday": "birthday", "hubby": "husband", "fav": "favorite",
    "favourite": "favorite", "gf": "girlfriend", "bf": "boyfriend", "job": "work", "db": "database",
    "config": "configuration", "repo": "repository", "k8s": "kubernetes", "prod": "production",
}

# Function characters that carry no topic on their own (their bigrams are still indexed).
CJK_STOP_CHARS = frozenset("的了吗呢吧啊呀是在我你他她它们这那有和与及或就都也还又很么什哪里个把被给让对从到为着过")


def normalize(text: str) -> str:
    """NFKC (fullwidth -> ASCII) and lowercase."""
    return unicodedata.normalize("NFKC", text).lower()


@lru_cache(maxsize=65536)
def word_terms(word: str) -> tuple[str, ...]:
    """Terms of one (lowercased) word: nothing for a stopword, else its stem (and a synonym's)."""
    word = word.replace("’", "'")
    if word in STOPWORDS:
        return ()
    out = []
    syn = SYNONYMS.get(word)
    if syn is not None:
        out.append(stem(syn))
    if word.endswith("'s"):
        word = word[:-2]
    word = word.replace("'", "")
    if word and word not in STOPWORDS:
        out.append(stem(word))
    return tuple(out)


def _cjk_terms(run: str, out: list[str]) -> None:
    run = CJK_PUNCT.sub(" ", run)
    for chunk in run.split():
        out.extend(ch for ch in chunk if ch not in CJK_STOP_CHARS)
        out.extend(chunk[i:i + 2] for i in range(len(chunk) - 1))


def analyze(text: str) -> list[str]:
    """Index/query terms of ``text`` (see module docstring)."""
    out: list[str] = []
    # "de-stress" is indexed as "destress", "de" and "stress".
    text = _HYPHENATED.sub(r"\1\2 \1 \2", normalize(text))
    for cjk, word in _RUN_RE.findall(text):
        if cjk:
            _cjk_terms(cjk, out)
        else:
            out.extend(word_terms(word))
    return out


def plain_words(text: str) -> list[str]:
    """The baseline analyzer: lowercased alphanumeric words, nothing else (no stemming, no stopwords)."""
    return re.findall(r"[a-z0-9]+", text.lower())

"""The identifier-like tokens of a fact: what must be equal for two facts to be near duplicates.

Trigram similarity sees "My order number is 4417." and "My order number is 4418." as 0.875
alike, yet they are different facts. Reconciliation therefore treats two texts as near
duplicates only when they name the same identifiers: numbers (with decimals, thousands
separators, a sign), dates, times, versions, codes such as "AB-1234", emails, URLs and dotted
names such as host names. Pure functions, no database.
"""

from __future__ import annotations

import re

# A URL: a scheme or "www.", up to white space or a quote/bracket; trailing sentence punctuation
# is not part of it.
_URL = re.compile(r"(?i)\b(?:[a-z][a-z0-9+.\-]*://|www\.)[^\s<>\"'`]+")
_URL_TRAILING = ".,;:!?)]}'\""
_EMAIL = re.compile(r"[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+")
# A run of word characters joined by separators that occur inside identifiers (a separator
# must be followed by a word character: the full stop ending a sentence is not part of it),
# with a minus sign in front when it stands alone before a digit ("-5 °C").
_CHUNK = re.compile(r"(?:(?<![\w\-])-(?=\d))?\w+(?:[\-./:,_+#]\w+)*")
_DIGIT = re.compile(r"\d")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _url(token: str) -> str:
    token = token.rstrip(_URL_TRAILING)
    scheme, sep, rest = token.partition("://")
    if not sep:
        host, slash, path = token.partition("/")
        return host.lower() + slash + path
    host, slash, path = rest.partition("/")
    return scheme.lower() + sep + host.lower() + slash + path


def _chunk(token: str) -> str:
    if _THOUSANDS.match(token):
        token = token.replace(",", "")
    return token.casefold()


def identifiers(text: str) -> frozenset[str]:
    """The identifier-like tokens of ``text``, normalized: URLs (scheme and host in lower case),
    emails (case-folded), and every other token that holds a digit or a dot between word
    characters (case-folded; "4,417" is 4417). Words without digits are not identifiers."""
    found: set[str] = set()

    def take_url(match: re.Match[str]) -> str:
        found.add(_url(match.group(0)))
        return " "

    def take_email(match: re.Match[str]) -> str:
        found.add(match.group(0).casefold())
        return " "

    rest = _URL.sub(take_url, text)
    rest = _EMAIL.sub(take_email, rest)
    for match in _CHUNK.finditer(rest):
        token = match.group(0)
        if _DIGIT.search(token) or "." in token:
            found.add(_chunk(token))
    return frozenset(found)


def same_identifiers(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same identifiers (as sets: repeating one changes
    nothing), the condition for them to be near duplicates at all."""
    return identifiers(a) == identifiers(b)

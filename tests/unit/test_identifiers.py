"""Identifier-like tokens (identifiers.py): what near duplicates must share (issue 10, item 11)."""

from __future__ import annotations

import datetime as dt
import string

from hypothesis import given
from hypothesis import strategies as st

from aidb_memory_server.identifiers import identifiers, same_identifiers

# Plain words: letters only, no dots, so that they are never identifiers themselves.
words = st.lists(st.text(string.ascii_letters, min_size=1, max_size=8), min_size=1, max_size=6)


def sentence(before: list[str], token: str, after: list[str]) -> str:
    return " ".join([*before, token, *after]) + "."


def test_the_issue_example() -> None:
    a = "Alice's order number is 4417."
    b = "Alice's order number is 4418."
    assert identifiers(a) == {"4417"}
    assert not same_identifiers(a, b)
    assert same_identifiers(a, "alice's ORDER number is 4417")


def test_each_kind() -> None:
    text = (
        "Paid $4,417.50 on 2024-03-05 at 14:30 (2:30pm), ticket AB-1234, v1.2.3, -5 C; "
        "mail Bob.Smith@Example.com, see https://Example.com/Path?q=1). Host db.internal."
    )
    assert identifiers(text) == {
        "4417.50",
        "2024-03-05",
        "14:30",
        "2:30pm",
        "ab-1234",
        "v1.2.3",
        "-5",
        "bob.smith@example.com",
        "https://example.com/Path?q=1",
        "db.internal",
    }


def test_words_without_digits_are_not_identifiers() -> None:
    assert identifiers("I like green tea, not coffee! Really?") == frozenset()


@given(words, st.integers(), words)
def test_an_integer_is_one_identifier(before: list[str], n: int, after: list[str]) -> None:
    assert identifiers(sentence(before, str(n), after)) == {str(n)}


@given(words, st.integers(min_value=0, max_value=10**12), words)
def test_thousands_separators_do_not_matter(before: list[str], n: int, after: list[str]) -> None:
    assert identifiers(sentence(before, f"{n:,}", after)) == {str(n)}


@given(words, st.integers(), st.integers(), words)
def test_different_numbers_are_different_facts(
    before: list[str], a: int, b: int, after: list[str]
) -> None:
    assert same_identifiers(sentence(before, str(a), after), sentence(before, str(b), after)) == (
        a == b
    )


@given(words, st.decimals(allow_nan=False, allow_infinity=False, places=3), words)
def test_a_decimal_keeps_its_fraction(before: list[str], x: object, after: list[str]) -> None:
    token = f"{x:f}"
    assert identifiers(sentence(before, token, after)) == {token}


@given(words, st.datetimes(), words)
def test_dates_and_times(before: list[str], when: dt.datetime, after: list[str]) -> None:
    day, time = when.date().isoformat(), when.strftime("%H:%M")
    assert identifiers(sentence(before, f"{day} {time}", after)) == {day, time}
    assert identifiers(sentence(before, when.strftime("%d/%m/%Y"), after)) == {
        when.strftime("%d/%m/%Y")
    }


@given(words, st.lists(st.integers(min_value=0, max_value=999), min_size=2, max_size=4), words)
def test_versions(before: list[str], parts: list[int], after: list[str]) -> None:
    version = ".".join(map(str, parts))
    assert identifiers(sentence(before, "v" + version, after)) == {"v" + version}
    assert identifiers(sentence(before, version, after)) == {version}


@given(
    words,
    st.text(string.ascii_uppercase, min_size=1, max_size=4),
    st.integers(min_value=0, max_value=10**6),
    words,
)
def test_codes_ignore_case(before: list[str], prefix: str, n: int, after: list[str]) -> None:
    code = f"{prefix}-{n}"
    assert identifiers(sentence(before, code, after)) == {code.casefold()}
    assert same_identifiers(sentence(before, code, after), sentence(before, code.lower(), after))


local = st.text(string.ascii_letters + string.digits + "._+-", min_size=1, max_size=10).filter(
    lambda s: s[0].isalnum() and s[-1].isalnum()
)
labels = st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=8)


@given(words, local, st.lists(labels, min_size=2, max_size=3), words)
def test_emails(before: list[str], user: str, host: list[str], after: list[str]) -> None:
    email = f"{user}@{'.'.join(host)}"
    assert identifiers(sentence(before, email, after)) == {email.casefold()}


@given(
    words,
    st.sampled_from(["http", "https", "ftp"]),
    st.lists(labels, min_size=2, max_size=3),
    # A path not ending in sentence punctuation (a trailing "?" or "." ends the sentence).
    st.text(string.ascii_letters + string.digits + "/-_=?&", max_size=12).filter(
        lambda s: not s.endswith("?")
    ),
    words,
)
def test_urls_keep_their_path(
    before: list[str], scheme: str, host: list[str], path: str, after: list[str]
) -> None:
    url = f"{scheme}://{'.'.join(host)}/{path}"
    assert identifiers(sentence(before, url, after)) == {url}
    assert identifiers(sentence(before, url.upper().replace(path.upper(), path), after)) == {url}


@given(words, words, st.lists(st.integers(), max_size=4))
def test_only_the_identifiers_matter_not_the_words(
    a: list[str], b: list[str], numbers: list[int]
) -> None:
    tokens = [str(n) for n in numbers]
    assert same_identifiers(" ".join(a + tokens) + ".", " ".join(tokens + b) + "!")
    assert same_identifiers(" ".join(a + tokens), " ".join(a + tokens + tokens))

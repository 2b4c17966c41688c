"""A PostgreSQL URL's password as libpq reads it: what the workers get (the URL without it, and the
password in PGPASSWORD) must be what libpq would have used, and no message may show it.

libpq itself is the reference: `psycopg.conninfo.conninfo_to_dict` parses with PQconninfoParse."""
from __future__ import annotations

from typing import Any

import pytest

from hermes.store.pg.url import MalformedUrl, check, hide, redact, split_password


def libpq() -> Any:
    """psycopg, asked per test, not at import: a run that selects none of these (the upstream
    environment's, which has no psycopg) must not report a skip for them."""
    return pytest.importorskip("psycopg", reason="psycopg 3 (the postgres extra) parses URLs as libpq does")


def conninfo_to_dict(url: str) -> dict[str, Any]:
    """libpq's own reading of `url` (PQconninfoParse)."""
    return libpq().conninfo.conninfo_to_dict(url)  # type: ignore[no-any-return]


URLS = [
    "postgresql://u:p%40ss@db.example:5432/hermes",                         # '@' percent-encoded
    "postgresql://u@db.example/hermes?password=a+b",                         # '+' is a plus sign to libpq
    "postgresql://u:p%2Bq+r%25@db.example/hermes?sslmode=require",
    "postgresql://u@/hermes?host=/run/pg&application_name=a%20b&password=x%26y&connect_timeout=5",
    "postgres://u:first@h/hermes?password=second",                           # the query's wins, as in libpq
    "postgresql://h/hermes?user=u",                                          # no password at all
    "postgresql://u:caf%C3%A9@h/hermes",                                     # UTF-8, percent-encoded
]


@pytest.mark.parametrize("url", URLS)
def test_the_workers_get_the_password_libpq_would_use_and_the_rest_unchanged(url: str) -> None:
    without, password = split_password(url)
    wanted = conninfo_to_dict(url)
    assert password == wanted.get("password")
    given = conninfo_to_dict(without)
    assert "password" not in given
    assert given == {k: v for k, v in wanted.items() if k != "password"}
    # what was not the password is kept as written (never re-encoded)
    for piece in ("application_name=a%20b", "sslmode=require", "host=/run/pg", "connect_timeout=5"):
        assert (piece in without) == (piece in url)


@pytest.mark.parametrize("url", URLS)
def test_no_message_shows_the_password(url: str) -> None:
    password = conninfo_to_dict(url).get("password")
    if password is None:
        assert redact(url) == url
        return
    assert password not in redact(url)
    raw = url.split("password=")[-1].split("&")[0] if "password=" in url else url.split(":")[2].split("@")[0]
    assert raw not in redact(url)
    assert hide(f"failed for {password} and {raw}", url) == "failed for *** and ***"


def test_a_malformed_percent_encoding_is_refused_without_quoting_the_password() -> None:
    for url in ("postgresql://u:s3cr%zzet@127.0.0.1:1/hermes", "postgresql://u@h/hermes?password=s3cr%zzet",
                "postgresql://u:s3cr%00et@h/hermes"):
        with pytest.raises(libpq().ProgrammingError, match="s3cr"):  # libpq's own words quote it
            conninfo_to_dict(url)
        with pytest.raises(MalformedUrl) as info:
            check(url)
        assert "s3cr" not in str(info.value) and "password" in str(info.value)
        with pytest.raises(MalformedUrl):
            split_password(url)
        assert "s3cr" not in redact(url)


def test_a_store_opened_with_a_malformed_url_says_so_in_words_of_its_own() -> None:
    from hermes.state import StorageError
    from hermes.store.engines import open_store

    with pytest.raises(StorageError) as info:
        open_store("postgresql://u:s3cr%zzet@127.0.0.1:1/hermes")
    assert "s3cr" not in str(info.value)

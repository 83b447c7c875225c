"""Which SQL `rollstream sql` accepts: one statement that reads (pure, no database).

The database connection is read-only as well (SQLite `mode=ro`, PostgreSQL
read-only transactions); this check comes first so that a write gets a clear
refusal, and it refuses more than one statement because on PostgreSQL a second
statement could end the read-only transaction and begin a read-write one.
"""

from __future__ import annotations

import re

READ_KEYWORDS = frozenset({"select", "with", "explain", "values", "table", "show"})
_DOLLAR_TAG = re.compile(r"\$[A-Za-z_0-9]*\$")


class WriteRefusedError(ValueError):
    """The statement is not a single read-only query; the message says why."""


def check_read_only(sql: str) -> str:
    """The statement without comments and a trailing `;`, or `WriteRefusedError`."""
    code = strip_literals_and_comments(sql).strip()
    body = code.rstrip(";").rstrip()
    if not body:
        raise WriteRefusedError(
            "empty statement: pass one SELECT, e.g. rollstream sql 'SELECT COUNT(*) FROM events'"
        )
    if ";" in body:
        raise WriteRefusedError("only one statement at a time: remove the `;` between statements")
    keyword = body.split(None, 1)[0].lower().lstrip("(")
    if keyword not in READ_KEYWORDS:
        raise WriteRefusedError(
            f"`{keyword.upper()}` statements are refused: `rollstream sql` opens the event store read-only "
            f"and runs only {', '.join(sorted(k.upper() for k in READ_KEYWORDS))}"
        )
    return sql.strip().rstrip(";").rstrip()


def strip_literals_and_comments(sql: str) -> str:
    """`sql` with string literals, quoted identifiers and comments blanked (keeps structure)."""
    out: list[str] = []
    i = 0
    while i < len(sql):
        char = sql[i]
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = len(sql) if end < 0 else end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            i = len(sql) if end < 0 else end + 2
            out.append(" ")
        elif char in "'\"":
            i = _skip_quoted(sql, i, char)
            out.append(" '' ")
        elif char == "$" and (tag := _DOLLAR_TAG.match(sql, i)):
            end = sql.find(tag.group(), tag.end())
            i = len(sql) if end < 0 else end + len(tag.group())
            out.append(" '' ")
        else:
            out.append(char)
            i += 1
    return "".join(out)


def _skip_quoted(sql: str, start: int, quote: str) -> int:
    """Index after the literal opened at `start` (a doubled quote is an escaped quote)."""
    i = start + 1
    while i < len(sql):
        if sql[i] == quote:
            if sql.startswith(quote * 2, i):
                i += 2
                continue
            return i + 1
        i += 1
    return i

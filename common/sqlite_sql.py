"""Reading and editing the text of a SQLite ``CREATE TABLE`` (its CHECK constraints).

SQLite keeps a table's CHECK constraints only in the text of its ``CREATE TABLE``
(``sqlite_master.sql``), and adds or drops a constraint only by a rebuild of the
table from an edited text.  The SQLite capture reads the CHECKs from that text
(:func:`checks`); a SQLite target edits its own tables' text to follow the source's
foreign keys and CHECKs (:func:`body_items`, :func:`with_items`).

The text is cut into tokens: quoted strings (``'...'`` with ``''``), quoted names
(``"..."``, ```...```, ``[...]``), comments (``--`` to the end of the line,
``/* ... */``), parentheses, commas, and words (anything else up to one of those
or a blank).  The table's body is what lies between the first ``(`` and the
parenthesis that closes it (table options such as ``WITHOUT ROWID`` follow); its
items are the pieces of the body between the commas at depth 0: column
definitions first, then table constraints.  A CHECK is the word ``CHECK`` at
depth 0 of an item followed by a parenthesised expression, named by a
``CONSTRAINT <name>`` just before it.  SQLite itself parses the text this way
(``parse.y``: a CHECK is ``CHECK LP expr RP`` in a column or table constraint
list), so a CHECK inside a string, a quoted name, a comment or a default
expression is not one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

__all__ = ["body_items", "checks", "with_items"]

_TOKEN = re.compile(
    r"""
      (?P<blank>\s+)
    | (?P<comment>--[^\n]*|/\*.*?(?:\*/|\Z))
    | (?P<string>'(?:[^']|'')*'?)
    | (?P<name>"(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?)
    | (?P<open>\()
    | (?P<close>\))
    | (?P<comma>,)
    | (?P<word>[^\s'"`\[(),]+)
    """,
    re.VERBOSE | re.DOTALL,
)


def _tokens(text: str) -> Iterator[tuple[str, str, int]]:
    """(kind, text, start) of each token; blanks and comments left out."""
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "word"
        if kind not in ("blank", "comment"):
            yield kind, m.group(), m.start()


def _body(sql: str) -> tuple[int, int] | None:
    """(start, end) of the body of ``CREATE TABLE ... ( body ) [options]``."""
    depth, start = 0, -1
    for kind, _text, at in _tokens(sql):
        if kind == "open":
            depth += 1
            if depth == 1 and start < 0:
                start = at + 1
        elif kind == "close":
            depth -= 1
            if depth == 0 and start >= 0:
                return start, at
    return None


def body_items(sql: str) -> list[str]:
    """The body's items (column definitions, table constraints), stripped, their
    comments blanked."""
    span = _body(sql)
    if span is None:
        return []
    # Comments become blanks: an item may be written back before a comma.
    body = "".join(
        " " if m.lastgroup == "comment" else m.group()
        for m in _TOKEN.finditer(sql[span[0] : span[1]])
    )
    out, depth, last = [], 0, 0
    for kind, _text, at in _tokens(body):
        if kind == "open":
            depth += 1
        elif kind == "close":
            depth -= 1
        elif kind == "comma" and depth == 0:
            out.append(body[last:at].strip())
            last = at + 1
    out.append(body[last:].strip())
    return [i for i in out if i]


def with_items(sql: str, name: str, items: Sequence[str]) -> str:
    """``sql`` (a ``CREATE TABLE``) creating table ``name`` (quoted) with the body
    ``items``, its table options kept."""
    span = _body(sql)
    if span is None:
        raise ValueError(f"not a CREATE TABLE with a body: {sql[:80]!r}")
    return f"CREATE TABLE {name} ({', '.join(items)}){sql[span[1] + 1 :]}"


def _unquote(name: str) -> str:
    if name[:1] in '"`' and name[-1:] == name[:1]:
        return name[1:-1].replace(name[0] * 2, name[0])
    if name[:1] == "[" and name[-1:] == "]":
        return name[1:-1]
    if name[:1] == "'" and name[-1:] == "'":
        return name[1:-1].replace("''", "'")
    return name


def checks(sql: str) -> list[tuple[str | None, str]]:
    """(name or None, expression) of each CHECK constraint in a ``CREATE TABLE``,
    column and table constraints alike, in the order written."""
    out: list[tuple[str | None, str]] = []
    for item in body_items(sql):
        tokens = list(_tokens(item))
        depth = 0
        for i, (kind, text, _at) in enumerate(tokens):
            if kind == "open":
                depth += 1
            elif kind == "close":
                depth -= 1
            elif (
                depth == 0
                and kind == "word"
                and text.upper() == "CHECK"
                and i + 1 < len(tokens)
                and tokens[i + 1][0] == "open"
            ):
                end = _closing(tokens, i + 1)
                if end is None:
                    continue
                expression = item[tokens[i + 1][2] + 1 : tokens[end][2]].strip()
                named = i >= 2 and tokens[i - 2][1].upper() == "CONSTRAINT"
                out.append((_unquote(tokens[i - 1][1]) if named else None, expression))
    return out


def _closing(tokens: Sequence[tuple[str, str, int]], open_at: int) -> int | None:
    depth = 0
    for j in range(open_at, len(tokens)):
        if tokens[j][0] == "open":
            depth += 1
        elif tokens[j][0] == "close":
            depth -= 1
            if depth == 0:
                return j
    return None

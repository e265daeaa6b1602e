"""Table names: how the configuration writes them and entries carry them.

One text form, used by the publication config (``tables = [...]``), by every entry's
``TableSchema.table`` / ``RowChange.table`` and by the subscriber's per-table options:

* ``name`` — a table in the source's default schema (``public`` on PostgreSQL, the
  main database on SQLite);
* ``schema.name`` — a table in schema ``schema``.

Each part is taken **exactly** as written: case kept, spaces kept, no folding to lower
case (unlike unquoted SQL).  A part that contains a dot or a double quote, or is empty,
is written in double quotes with its quotes doubled, as SQL does: the table ``a.b`` in
the default schema is ``"a.b"``, the table ``x"y`` in schema ``Sales`` is
``Sales."x""y"``.  Every name has exactly one form (:func:`format_table`); a part may be
quoted when it need not be (``"Sales"."Order Items"`` reads as ``Sales.Order Items``).

Names already on disk (logs, target metadata) written before this form existed had no
dots or quotes in their parts, and read the same.

:func:`quote_ident` is the one SQL identifier quoting both dialects share (PostgreSQL
and SQLite both quote with double quotes and double a quote inside).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TableRef", "format_table", "parse_table", "quote_ident", "unqualified"]


_HOW = (
    "write `name` or `schema.name`; put a part holding a dot or a double quote in double"
    ' quotes, its quotes doubled: `"a.b"`, `Sales."x""y"`'
)


def quote_ident(name: str) -> str:
    """``name`` as an SQL identifier (PostgreSQL and SQLite): always double-quoted."""
    return '"' + name.replace('"', '""') + '"'


def _part(text: str) -> str:
    return quote_ident(text) if not text or "." in text or '"' in text else text


@dataclass(frozen=True, slots=True)
class TableRef:
    """A table's schema (None: the default one) and name."""

    schema: str | None
    name: str

    def __str__(self) -> str:
        return format_table(self.schema, self.name)

    @property
    def flat(self) -> str:
        """One identifier for targets without schemas (SQLite): ``schema.name`` or ``name``."""
        return self.name if self.schema is None else f"{self.schema}.{self.name}"


def format_table(schema: str | None, name: str) -> str:
    """The text form of table ``name`` in ``schema`` (None: the default schema)."""
    return _part(name) if schema is None else f"{_part(schema)}.{_part(name)}"


def parse_table(text: str) -> TableRef:
    """Read the text form; ValueError (saying how to write it) if it is not one."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == '"':
            out, i = [], i + 1
            while True:
                j = text.find('"', i)
                if j < 0:
                    raise ValueError(f"table {text!r}: a double quote is not closed; {_HOW}")
                out.append(text[i:j])
                if text[j + 1 : j + 2] == '"':
                    out.append('"')
                    i = j + 2
                    continue
                i = j + 1
                break
            parts.append("".join(out))
        else:
            j = text.find(".", i)
            j = n if j < 0 else j
            part = text[i:j]
            if not part or '"' in part:
                raise ValueError(f"table {text!r}: {_HOW}")
            parts.append(part)
            i = j
        if i == n:
            break
        if text[i] != "." or len(parts) == 2:
            raise ValueError(f"table {text!r}: {_HOW}")
        i += 1
    if len(parts) == 1:
        return TableRef(None, parts[0])
    return TableRef(parts[0], parts[1])


def unqualified(spec: str, source: str) -> str:
    """The one table a configured name means on a source whose tables have no schema.

    ``source`` says which (for the message: "a SQLite source has no schemas").  A
    ValueError when ``spec`` is malformed or names a schema.
    """
    ref = parse_table(spec)
    if ref.schema is not None:
        raise ValueError(
            f"table {spec!r}: {source}; a table whose name holds a dot is written in"
            f" double quotes: {format_table(None, ref.flat)!r}"
        )
    return ref.name

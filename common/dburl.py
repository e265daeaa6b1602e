"""A database URL parsed once: which dialect, and where.

The daemons' configs, the writers, the capture and the snapshot loaders take a
:class:`DatabaseUrl` instead of testing string prefixes.  Accepted forms::

    sqlite:///relative/or/absolute/path.db     (three slashes; a relative path is
    sqlite:////absolute/path.db                 taken relative to the config file)
    postgresql://user:password@host:port/db    (also postgres://; libpq keywords in
                                                the query string pass through)
    mariadb://user:password@host:port/db       (also mysql://; ?unix_socket=PATH
                                                connects through a local socket)

The dialect names are the keys of each daemon's registry of sources and targets
(``publisher.capture``, ``subscriber.targets``).  A URL of any other scheme is
refused with a message naming the key and the accepted forms.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["DIALECTS", "DatabaseUrl", "Dialect", "mariadb_params"]

Dialect = Literal["sqlite", "postgresql", "mariadb"]
DIALECTS: tuple[Dialect, ...] = ("sqlite", "postgresql", "mariadb")

_SCHEMES: dict[str, Dialect] = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "mariadb": "mariadb",
    "mysql": "mariadb",
}
_FORMS = "use sqlite:///PATH, postgresql://USER@HOST:PORT/DB or mariadb://USER@HOST:PORT/DB"


@dataclasses.dataclass(frozen=True)
class DatabaseUrl:
    """``raw`` as the operator wrote it; ``dialect``; ``path`` for SQLite files."""

    raw: str
    dialect: Dialect
    path: Path | None = None

    @classmethod
    def parse(cls, raw: str, *, field: str = "url", base_dir: str | Path = ".") -> DatabaseUrl:
        """Parse ``raw``; a ValueError names ``field`` and the accepted forms."""
        scheme, sep, rest = raw.partition("://")
        dialect = _SCHEMES.get(scheme.lower()) if sep else None
        if dialect is None:
            raise ValueError(f"{field} {raw!r}: {_FORMS}")
        if dialect == "sqlite":
            if not rest.startswith("/") or len(rest) < 2:
                raise ValueError(f"{field} {raw!r}: a SQLite URL is sqlite:///PATH")
            p = Path(rest[1:])
            return cls(raw, dialect, p if p.is_absolute() else Path(base_dir) / p)
        if not rest:
            raise ValueError(f"{field} {raw!r}: {_FORMS}")
        if dialect == "mariadb" and not rest.partition("?")[0].partition("/")[2]:
            raise ValueError(f"{field} {raw!r}: name the database, mariadb://USER@HOST:PORT/DB")
        return cls(raw, dialect)

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    @property
    def sqlite_path(self) -> Path:
        """The SQLite file; a ValueError for any other dialect."""
        if self.path is None:
            raise ValueError(f"{self.raw!r} is not a SQLite URL")
        return self.path

    def __str__(self) -> str:
        return self.raw


def mariadb_params(url: DatabaseUrl | str, *, role: str = "target") -> dict[str, Any]:
    """Where a ``mariadb://`` URL connects, as PyMySQL keyword arguments.

    ``user`` (default root), ``password``, ``database``, and ``unix_socket`` or
    ``host`` / ``port`` (default 127.0.0.1:3306).  A ValueError names what is missing.
    """
    raw = str(url)
    parts = urlsplit(raw)
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ValueError(f"{role} {raw!r}: name the database, mariadb://USER@HOST:PORT/DB")
    args: dict[str, Any] = {
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "database": database,
    }
    query = parse_qs(parts.query)
    if "unix_socket" in query:
        args["unix_socket"] = query["unix_socket"][0]
    else:
        args["host"] = parts.hostname or "127.0.0.1"
        args["port"] = parts.port or 3306
    return args

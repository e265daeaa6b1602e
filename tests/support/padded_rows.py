"""Rows of about 2 KB into a SQLite source's table ``t(id, v)``, one transaction (one
captured entry, or a few) each: a log that spans many small segments quickly."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


def insert_padded(source: Path, start: int, count: int, size: int = 2000) -> None:
    """Insert ids ``start``..``start + count - 1``, pausing 20 ms between them."""
    conn = sqlite3.connect(str(source), isolation_level=None)
    try:
        for i in range(start, start + count):
            conn.execute("INSERT INTO t VALUES (?, ?)", (i, "x" * size))
            time.sleep(0.02)
    finally:
        conn.close()

"""Snapshot load progress (rows, rows/s, ETA) for ``txrepl subscriber status``.

A load runs in one of two places, and both show in the daemon's status
(``SubscriptionStatus.snapshot``, a ``SnapshotLoad``):

- **the daemon** loads a snapshot itself (``initial = "snapshot"``, or
  ``"auto"`` after a purge): :class:`ProgressBoard` keeps the latest progress
  of each subscription in memory while the load runs, and forgets it when the
  load ends (loaded or failed).
- **``txrepl subscriber reinit``** loads in its own process (the daemon is
  paused meanwhile): :class:`ProgressFile` writes the progress to
  ``<data_dir>/reinit/<subscription>.json`` (whole: a temporary file renamed
  over it; at most every ``every_s``), and removes it when the command ends.
  The board reads that file while its process lives: a file left by a killed
  command names a pid that is gone and is ignored (then overwritten by the
  next reinit).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.rpc import txrepl_pb2 as pb
from subscriber.reinit.client import SnapshotProgress

__all__ = ["ProgressBoard", "ProgressFile", "snapshot_load"]


def snapshot_load(p: SnapshotProgress, by: str) -> pb.SnapshotLoad:
    eta = p.eta_s
    return pb.SnapshotLoad(
        rows_loaded=p.rows_loaded,
        rows_expected=p.rows_expected,
        rows_per_s=round(p.rate, 1),
        eta_s=-1.0 if eta is None else round(eta, 1),
        seq=p.seq,
        by=by,
    )


def _path(data_dir: Path, subscription: str) -> Path:
    return data_dir / "reinit" / f"{subscription}.json"


class ProgressFile:
    """The reinit command's progress, written for the daemon's status."""

    def __init__(self, data_dir: Path, subscription: str, every_s: float = 0.25) -> None:
        self.path = _path(data_dir, subscription)
        self.every_s = every_s
        self._last = 0.0

    def report(self, p: SnapshotProgress) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s and p.rows_loaded < p.rows_expected:
            return
        self._last = now
        load = snapshot_load(p, "reinit")
        body = {
            "pid": os.getpid(),
            "rows_loaded": load.rows_loaded,
            "rows_expected": load.rows_expected,
            "rows_per_s": load.rows_per_s,
            "eta_s": load.eta_s,
            "seq": load.seq,
        }
        with contextlib.suppress(OSError):  # progress is advisory: never fail the load
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(body))
            tmp.replace(self.path)

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ProgressBoard:
    """What the daemon shows of the loads under way (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._lock = threading.Lock()
        self._loads: dict[str, pb.SnapshotLoad] = {}

    def reporter(self, subscription: str) -> Callable[[SnapshotProgress], None]:
        def report(p: SnapshotProgress) -> None:
            load = snapshot_load(p, "daemon")
            with self._lock:
                self._loads[subscription] = load

        return report

    def tracked(
        self, subscription: str, load: Callable[[], tuple[str, int]]
    ) -> Callable[[], tuple[str, int]]:
        """``load``, forgetting the subscription's progress when it ends."""

        def run() -> tuple[str, int]:
            try:
                return load()
            finally:
                with self._lock:
                    self._loads.pop(subscription, None)

        return run

    def current(self, subscription: str) -> pb.SnapshotLoad | None:
        with self._lock:
            mine = self._loads.get(subscription)
        if mine is not None:
            return mine
        try:
            body: Any = json.loads(_path(self.data_dir, subscription).read_text())
            if not _alive(int(body["pid"])):
                return None
            return pb.SnapshotLoad(
                rows_loaded=int(body["rows_loaded"]),
                rows_expected=int(body["rows_expected"]),
                rows_per_s=float(body["rows_per_s"]),
                eta_s=float(body["eta_s"]),
                seq=int(body["seq"]),
                by="reinit",
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

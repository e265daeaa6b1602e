"""Re-initialisation: load a publisher snapshot into the target, then resume from it.

Public face::

    from subscriber.reinit import load_into, SnapshotError, SnapshotRefused

    incarnation, seq = load_into(loader, address=..., publisher=..., publication=...,
                                 subscriber=..., spark=spark, tables=options.tables)

``client.py`` reads the Snapshot stream and drives a target's :class:`ShadowLoader`;
``shape.py`` shapes the rows of tables with transforms; ``errors.py`` draws the
tree.  The loaders themselves live with their target (``subscriber.targets``),
which also opens the right one for a target URL (``open_snapshot_loader``,
``load_snapshot``) and builds the loader a subscription uses (``snapshot_loader``,
shared by ``txrepl subscriber reinit`` and the daemon).
"""

from subscriber.reinit.client import ShadowLoader, SnapshotProgress, load_into
from subscriber.reinit.errors import SnapshotError, SnapshotRefused

__all__ = ["ShadowLoader", "SnapshotError", "SnapshotProgress", "SnapshotRefused", "load_into"]

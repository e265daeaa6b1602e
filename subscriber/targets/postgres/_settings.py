"""A batch's session settings: one ``SELECT set_config(...), ...`` in its transaction.

Each is ``SET LOCAL`` (``set_config(name, value, true)``): it ends with the
transaction.  ``session_replication_role`` must be in effect for every row
statement (target triggers do not fire twice), ``synchronous_commit`` for COMMIT,
``lock_timeout`` for the level row's lock, and the replication origin's stamp
(``_origin.py``) before COMMIT.

**Folded into the level guard** (:func:`folded`).  A pipelined batch's first
statement after BEGIN (and the origin's, when it changes) is the level row's lock
and check (``_pipeline.py``); the settings ride in it as more columns, instead of a
statement of their own (one statement fewer per in-sync batch).  No statement
before the guard needs them, and each statement after it runs once they are set:
the guard's target list is computed before any later statement starts, and when
the guard fails nothing after it runs.  Not folded when a ``lock_timeout`` is set
(it must be in effect before the lock is waited for) or a replay role (``SET LOCAL
ROLE`` comes after the settings, which need the writer's own rights).
"""

from __future__ import annotations

__all__ = ["folded", "session_settings"]


def session_settings(
    stamp: str, replication_role: str, synchronous: str, lock_timeout_s: float | None
) -> tuple[list[str], list[str]]:
    """The settings' select-list items (each with at most one ``%s``) and their values;
    ``stamp``: the origin's item, or ""; ``synchronous``: "" for the server's."""
    fields = [stamp] if stamp else []
    fields.append("set_config('session_replication_role', %s, true)")
    params = [replication_role]
    if synchronous:
        fields.append("set_config('synchronous_commit', %s, true)")
        params.append(synchronous)
    if lock_timeout_s is not None:
        fields.append("set_config('lock_timeout', %s, true)")
        params.append(f"{int(lock_timeout_s * 1000)}ms")
    return fields, params


def folded(fields: list[str], values: list[str]) -> tuple[str, list[str]]:
    """``fields`` as more columns of another statement with named parameters
    ``p0``, ``p1``...: (", f0, f1", ``values``)."""
    it = iter(range(len(values)))
    named = [f.replace("%s", f"%(p{next(it)})s") if "%s" in f else f for f in fields]
    return "".join(", " + f for f in named), values

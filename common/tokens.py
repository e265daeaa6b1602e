"""Bearer tokens: their stored hashes, and who a presented token belongs to.

A client presents a token as the gRPC metadata ``x-txrepl-token``
(:func:`token_from_metadata`); configs store only its hash (:func:`hash_token`):
``sha256:<hex>`` (right for the long random tokens :func:`generate_token` makes,
``txrepl token generate``) or ``pbkdf2-sha256:<iterations>:<salt hex>:<hash hex>``
(slow on purpose, for tokens a person chose).  A :class:`TokenBook` checks every
stored hash once (:func:`check_hash`, so a typo stops the daemon at start) and
maps a presented token to a :class:`Principal` (a name, a role, the publications
it may use), comparing in constant time and remembering verdicts by the token's
sha256 so a pbkdf2 hash is not recomputed on every call.  What a principal may
call is common/security.py's (its :class:`~common.security.AuthInterceptor`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from common._calltoken import TOKEN_METADATA

__all__ = [
    "PBKDF2_ITERATIONS",
    "Principal",
    "TokenBook",
    "check_hash",
    "generate_token",
    "hash_token",
    "token_from_metadata",
    "verify_token",
]

PBKDF2_ITERATIONS = 200_000


def hash_token(token: str, scheme: str = "sha256", *, iterations: int = PBKDF2_ITERATIONS) -> str:
    """The stored form of ``token``: ``sha256:<hex>`` or ``pbkdf2-sha256:<n>:<salt>:<hash>``."""
    if not token:
        raise ValueError("an empty token cannot be hashed")
    if scheme == "sha256":
        return "sha256:" + hashlib.sha256(token.encode()).hexdigest()
    if scheme == "pbkdf2-sha256":
        salt = secrets.token_bytes(16)
        dk = hashlib.pbkdf2_hmac("sha256", token.encode(), salt, iterations)
        return f"pbkdf2-sha256:{iterations}:{salt.hex()}:{dk.hex()}"
    raise ValueError(f"unknown hash scheme {scheme!r}; use sha256 or pbkdf2-sha256")


def check_hash(stored: str) -> None:
    """Raise ValueError unless ``stored`` is a token hash this module can verify."""
    scheme, _, rest = stored.partition(":")
    if scheme == "sha256":
        if len(rest) == 64 and all(c in "0123456789abcdef" for c in rest):
            return
    elif scheme == "pbkdf2-sha256":
        parts = rest.split(":")
        if len(parts) == 3 and parts[0].isdigit() and int(parts[0]) >= 1000:
            try:
                bytes.fromhex(parts[1])
                bytes.fromhex(parts[2])
                return
            except ValueError:
                pass
    raise ValueError(
        "not a token hash: use 'sha256:<64 hex digits>' or "
        "'pbkdf2-sha256:<iterations>:<salt hex>:<hash hex>' (make one with 'txrepl token hash')"
    )


def verify_token(token: str, stored: str) -> bool:
    """Constant-time check of ``token`` against its stored hash."""
    scheme, _, rest = stored.partition(":")
    if scheme == "sha256":
        digest = hashlib.sha256(token.encode()).hexdigest()
        return hmac.compare_digest(digest, rest)
    if scheme == "pbkdf2-sha256":
        n, salt, want = rest.split(":")
        dk = hashlib.pbkdf2_hmac("sha256", token.encode(), bytes.fromhex(salt), int(n))
        return hmac.compare_digest(dk.hex(), want)
    return False


def generate_token() -> str:
    """A new random token (256 bits, URL-safe text)."""
    return "txr_" + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a token belongs to: a name, a role, and what it may reach."""

    name: str
    role: str  # "admin" | "publisher" | "subscriber"
    publications: tuple[str, ...] = ("*",)

    def may_use(self, publication: str) -> bool:
        return "*" in self.publications or publication in self.publications


class TokenBook:
    """Maps presented tokens to principals, checking them against stored hashes."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        self.entries = list(entries)
        for stored, _ in self.entries:
            check_hash(stored)
        # pbkdf2 is slow on purpose: remember verdicts by the token's sha256.
        self._cache: OrderedDict[str, Principal | None] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return bool(self.entries)

    def identify(self, token: str) -> Principal | None:
        if not token:
            return None
        key = hashlib.sha256(token.encode()).hexdigest()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        found = next((p for stored, p in self.entries if verify_token(token, stored)), None)
        self._cache[key] = found
        while len(self._cache) > 1024:
            self._cache.popitem(last=False)
        return found


def token_from_metadata(metadata: Iterable[tuple[str, Any]] | None) -> str:
    for key, value in metadata or ():
        if key == TOKEN_METADATA:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""

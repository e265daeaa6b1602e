"""Transport security and credentials shared by both daemons and the CLI.

Model (see docs/operations.md):

- **TLS** on every gRPC port: a server certificate and key from the config; with a
  client CA configured the server requires and verifies client certificates
  (mutual TLS).  Without TLS a daemon listens on loopback only, unless the config
  says ``allow_insecure_non_loopback = true`` (:func:`check_listen`).
- **Tokens**: each client presents a bearer token as the gRPC metadata
  ``x-txrepl-token``.  Configs store only hashes (:func:`hash_token`, common/tokens.py):
  ``sha256:<hex>`` (right for the long random tokens ``txrepl token generate``
  makes) or ``pbkdf2-sha256:<iterations>:<salt hex>:<hash hex>`` (for tokens a
  person chose).  A :class:`TokenBook` maps a presented token to a
  :class:`Principal` (a name, a role, the publications it may use).
- :class:`AuthInterceptor` checks every call against a table of :class:`Rule`
  (one per method, or per service) before any servicer runs: no token or an
  unknown one → UNAUTHENTICATED; a token of the wrong role → PERMISSION_DENIED;
  then, for a rule that names the request's ``publication`` field (and
  ``subscriber`` field), the token's grants must include that publication and a
  subscriber token must be that subscriber's → PERMISSION_DENIED otherwise.  The
  servicer never sees a refused request, so a refused call reads and changes
  nothing.  A stream-request method (``Sync``) names its publication in its first
  message: its rule says ``in_stream`` and the service checks the same grants
  (:func:`grant_problem`) on that message before it touches anything.
- Fail closed: a method with no rule is refused (PERMISSION_DENIED), so a new RPC
  cannot slip past the table; only :data:`PUBLIC_SERVICES` (health checking,
  reflection) are open by design.  tests/unit/common/test_auth_rules.py
  enumerates every method of every service in the proto descriptors and fails on
  one without a rule, or with a non-admin role and no per-publication scope.

Tokens are never logged (common.logging masks keys naming tokens) and never
stored in clear by the daemons.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import grpc

from common._calltoken import TOKEN_METADATA, aio_token_interceptors, with_token
from common.config import UnreadableFileError, parse_address
from common.tokens import (
    Principal,
    TokenBook,
    check_hash,
    generate_token,
    hash_token,
    token_from_metadata,
    verify_token,
)

__all__ = [
    "PUBLIC_SERVICES",
    "TOKEN_METADATA",
    "AuthInterceptor",
    "ClientTls",
    "Principal",
    "Rule",
    "ServerTls",
    "TokenBook",
    "add_client_args",
    "aio_channel_factory",
    "channel_from_args",
    "check_hash",
    "check_listen",
    "client_channel",
    "client_credentials",
    "client_from_args",
    "generate_token",
    "grant_problem",
    "hash_token",
    "is_loopback",
    "read_token_file",
    "register",
    "server_credentials",
    "token_from_metadata",
    "verify_token",
]

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 20_000),
]

# -- the server interceptor -------------------------------------------------------------


def _denied(
    handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, message: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as ``handler`` that only aborts with ``code``."""

    async def abort(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, message)

    kw: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    make: Any = grpc.unary_unary_rpc_method_handler
    if handler.request_streaming and handler.response_streaming:
        make = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        make = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        make = grpc.unary_stream_rpc_method_handler
    denied: grpc.RpcMethodHandler[Any, Any] = make(abort, **kw)
    return denied


PUBLIC_SERVICES = (
    "grpc.health.v1.Health",  # probes (systemd, containers, load balancers)
    "grpc.reflection.v1alpha.ServerReflection",  # grpcurl; describes, never reads data
)


@dataclasses.dataclass(frozen=True)
class Rule:
    """Who may call a method, and where the call names the publication it reaches.

    ``publication`` / ``subscriber``: names of request fields checked against the
    token's grants (:func:`grant_problem`) before the servicer runs; ``in_stream``:
    the method's first stream message names them and the service checks it.
    A rule with neither reaches every publication: fit only for admin tokens.
    """

    roles: frozenset[str]
    publication: str = ""
    subscriber: str = ""
    in_stream: bool = False

    @property
    def scoped(self) -> bool:
        return bool(self.publication) or self.in_stream


def grant_problem(principal: Principal, publication: str, subscriber: str | None) -> str:
    """Why ``principal`` may not reach ``publication`` as ``subscriber`` ("" when it may).

    ``subscriber``: the subscriber the call acts for (None: the call names none); a
    subscriber token acts only for its own subscriber.
    """
    if principal.role == "subscriber" and subscriber is not None and principal.name != subscriber:
        return f"this token is not subscriber {subscriber!r}'s"
    if not principal.may_use(publication):
        return f"{principal.role} {principal.name!r} is not granted publication {publication!r}"
    return ""


def _scoped(
    handler: grpc.RpcMethodHandler[Any, Any], rule: Rule, principal: Principal
) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` behind a check of the request's publication (and subscriber) fields."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        subscriber = getattr(request, rule.subscriber) if rule.subscriber else None
        problem = grant_problem(principal, getattr(request, rule.publication), subscriber)
        if problem:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, problem)

    kw: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_stream is not None:
        inner_stream: Any = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await refuse(request, context)
            out = inner_stream(request, context)
            if hasattr(out, "__aiter__"):
                try:
                    async for item in out:
                        yield item
                finally:  # a cancelled call: the servicer's clean-up runs now, not at GC
                    await out.aclose()
            else:  # a servicer writing with context.write()
                await out

        return grpc.unary_stream_rpc_method_handler(stream, **kw)
    inner: Any = handler.unary_unary
    assert inner is not None, "in_stream rules cover stream-request methods"

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await refuse(request, context)
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(unary, **kw)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Checks every call against ``rules``: method path (or ``/service/`` prefix) → Rule.

    An exact method path wins over its service's prefix; a method matching no rule
    is refused unless its service is in ``public``.
    """

    def __init__(
        self,
        book: TokenBook,
        rules: Mapping[str, Rule],
        public: Iterable[str] = PUBLIC_SERVICES,
    ) -> None:
        self.book = book
        self.rules = dict(rules)
        self.public = frozenset(public)

    def rule_for(self, method: str) -> Rule | None:
        """The rule of ``/package.Service/Method`` (None: no rule)."""
        if method in self.rules:
            return self.rules[method]
        service = method[: method.rfind("/") + 1]
        return self.rules.get(service)

    def is_public(self, method: str) -> bool:
        return method.split("/")[1] in self.public if method.count("/") == 2 else False

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or self.is_public(method):
            return handler
        rule = self.rule_for(method)
        if rule is None:
            return _denied(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} has no authorisation rule on this server; refused",
            )
        token = token_from_metadata(handler_call_details.invocation_metadata)
        if not token:
            return _denied(
                handler,
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method} needs a token: send it as gRPC metadata '{TOKEN_METADATA}'",
            )
        principal = self.book.identify(token)
        if principal is None:
            return _denied(handler, grpc.StatusCode.UNAUTHENTICATED, "unknown or revoked token")
        if principal.role not in rule.roles:
            return _denied(
                handler,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method} needs a {' or '.join(sorted(rule.roles))} token; "
                f"this one is a {principal.role} token ({principal.name})",
            )
        if rule.publication and not handler.request_streaming:
            return _scoped(handler, rule, principal)
        return handler


# -- TLS --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerTls:
    """``[tls]`` of a daemon: its certificate chain and key; a client CA makes it mutual."""

    cert_file: str = ""
    key_file: str = ""
    client_ca_file: str = ""  # set: clients must present a certificate signed by this CA

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("tls: cert_file and key_file go together")
        if self.client_ca_file and not self.cert_file:
            raise ValueError("tls: client_ca_file needs cert_file and key_file")

    @property
    def enabled(self) -> bool:
        return bool(self.cert_file)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UnreadableFileError(
            str(path), what, f"cannot read it ({e.strerror or e}); give a readable file"
        ) from None


def server_credentials(
    tls: ServerTls, resolve: Callable[[str], Path] = Path
) -> grpc.ServerCredentials | None:
    """Server credentials for ``tls`` (None when TLS is off); paths go through ``resolve``."""
    if not tls.enabled:
        return None
    key = _read(resolve(tls.key_file), "tls.key_file")
    cert = _read(resolve(tls.cert_file), "tls.cert_file")
    if tls.client_ca_file:
        ca = _read(resolve(tls.client_ca_file), "tls.client_ca_file")
        return grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=ca, require_client_auth=True
        )
    return grpc.ssl_server_credentials([(key, cert)])


@dataclasses.dataclass(frozen=True)
class ClientTls:
    """How a client reaches a TLS server: CA (default: system roots), optional client cert."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""  # override the name checked against the certificate


def client_credentials(
    tls: ClientTls, resolve: Callable[[str], Path] = Path
) -> grpc.ChannelCredentials:
    ca = _read(resolve(tls.ca_file), "ca_file (--ca)") if tls.ca_file else None
    key = _read(resolve(tls.key_file), "key_file (--key)") if tls.key_file else None
    cert = _read(resolve(tls.cert_file), "cert_file (--cert)") if tls.cert_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def _options(tls: ClientTls | None) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = list(CHANNEL_OPTIONS)
    if tls is not None and tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return options


def client_channel(
    address: str,
    tls: ClientTls | None,
    resolve: Callable[[str], Path] = Path,
    *,
    token: str = "",
) -> grpc.Channel:
    """THE builder of every blocking client channel (CLI commands, Publish client,
    snapshot and reinit, health checks): TLS when ``tls`` is given (mutual with its
    client certificate), and with ``token`` every call carries it as
    :data:`TOKEN_METADATA`, so no caller builds call metadata itself.  Paths go
    through ``resolve``; an unreadable file is a ValueError naming it."""
    if tls is None:
        channel = grpc.insecure_channel(address, options=_options(None))
    else:
        creds = client_credentials(tls, resolve)
        channel = grpc.secure_channel(address, creds, options=_options(tls))
    return with_token(channel, token) if token else channel


def aio_channel_factory(
    tls: ClientTls | None, resolve: Callable[[str], Path] = Path, *, token: str = ""
) -> Callable[[str], grpc.aio.Channel]:
    """The asyncio twin of :func:`client_channel` (the daemon's Sync), as a
    ``channel_factory``: same options, TLS and token; credentials are read once, now."""
    options = _options(tls)
    interceptors = aio_token_interceptors(token)
    if tls is None:
        return lambda address: grpc.aio.insecure_channel(
            address, options=options, interceptors=interceptors
        )
    creds = client_credentials(tls, resolve)
    return lambda address: grpc.aio.secure_channel(
        address, creds, options=options, interceptors=interceptors
    )


# -- where a daemon may listen ------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(address: str, *, field: str, tls: bool, allow_insecure: bool) -> None:
    """Refuse a plaintext listener off loopback unless explicitly allowed."""
    host, _ = parse_address(address, field=field)
    if tls or allow_insecure or is_loopback(host):
        return
    raise ValueError(
        f"{field} {address!r} is not a loopback address and [tls] is not configured: "
        "configure tls.cert_file and tls.key_file, or set allow_insecure_non_loopback = true "
        "(plaintext on the network)"
    )


# -- CLI: client options and `txrepl token` ------------------------------------------------


def read_token_file(path: Path, field: str = "token_file") -> str:
    """The token held in ``path`` (surrounding blanks stripped); a ConfigError naming
    ``field`` when the file cannot be read or is empty."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        problem = getattr(e, "strerror", None) or str(e)
        raise UnreadableFileError(
            str(path), field, f"cannot read the token ({problem}); give a readable file"
        ) from None
    if not token:
        raise UnreadableFileError(str(path), field, "the file is empty; put the token in it")
    return token


def add_client_args(parser: argparse.ArgumentParser) -> None:
    """--tls/--ca/--cert/--key/--server-name/--token-file (token also from $TXREPL_TOKEN)."""
    g = parser.add_argument_group("connection security")
    g.add_argument("--tls", action="store_true", help="use TLS (implied by --ca)")
    g.add_argument("--ca", default="", help="CA certificate file (default: system roots)")
    g.add_argument("--cert", default="", help="client certificate (mutual TLS)")
    g.add_argument("--key", default="", help="client private key (mutual TLS)")
    g.add_argument("--server-name", default="", help="name to check in the server certificate")
    g.add_argument(
        "--token-file", default="", help="file holding the token (default: $TXREPL_TOKEN)"
    )


def client_from_args(args: argparse.Namespace) -> tuple[ClientTls | None, str]:
    """TLS settings and the token ("" for none) from the options of
    :func:`add_client_args`; hand both to :func:`client_channel`."""
    tls = None
    if args.tls or args.ca or args.cert:
        tls = ClientTls(args.ca, args.cert, args.key, args.server_name)
    if args.token_file:
        token = read_token_file(Path(args.token_file), "--token-file")
    else:
        token = os.environ.get("TXREPL_TOKEN", "")
    return tls, token


def channel_from_args(args: argparse.Namespace, address: str) -> grpc.Channel:
    """:func:`client_channel` to ``address`` with the options of :func:`add_client_args`."""
    tls, token = client_from_args(args)
    return client_channel(address, tls, token=token)


def register(sub: Any) -> None:
    t = sub.add_parser("token", help="make tokens and their hashes for the configs")
    tsub = t.add_subparsers(dest="action", metavar="ACTION", required=True)
    h = tsub.add_parser("hash", help="print the hash of a token (read from stdin or --token-file)")
    h.add_argument("--token-file", default="", help="default: read the token from stdin")
    h.add_argument("--scheme", choices=["sha256", "pbkdf2-sha256"], default="sha256")
    h.set_defaults(func=_hash)
    g = tsub.add_parser("generate", help="print a new random token and its hash")
    g.add_argument("--scheme", choices=["sha256", "pbkdf2-sha256"], default="sha256")
    g.set_defaults(func=_generate)


def _hash(args: argparse.Namespace) -> int:
    if args.token_file:
        token = Path(args.token_file).read_text(encoding="utf-8").strip()
    else:
        token = sys.stdin.readline().strip()
    if not token:
        print("txrepl: no token given (stdin or --token-file)", file=sys.stderr)
        return 2
    print(hash_token(token, args.scheme))
    return 0


def _generate(args: argparse.Namespace) -> int:
    token = generate_token()
    print(f"token: {token}")
    print(f"hash:  {hash_token(token, args.scheme)}")
    return 0

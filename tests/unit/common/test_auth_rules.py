"""Every RPC either daemon serves has an authorisation rule (invariant 9), checked
against the proto descriptors, and the interceptor refuses a method without one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from common.rpc import txrepl_pb2 as pb
from common.security import PUBLIC_SERVICES, AuthInterceptor, Principal, Rule, TokenBook, hash_token
from publisher.service import AUTH_RULES as PUBLISHER_RULES
from subscriber.control import AUTH_RULES as CONTROL_RULES

# Which daemon serves each service of the wire contract.  A new service must be
# placed here (and given rules) before this test passes.
SERVED_BY: Mapping[str, Mapping[str, Rule]] = {
    "Replication": PUBLISHER_RULES,
    "Admin": PUBLISHER_RULES,
    "SubscriberControl": CONTROL_RULES,
}


def test_every_service_of_the_contract_is_served_by_a_daemon_with_rules() -> None:
    """A service added to the proto fails here until a daemon's rule table covers it."""
    assert set(pb.DESCRIPTOR.services_by_name) == set(SERVED_BY)


@pytest.mark.parametrize(
    ("service", "method"),
    [(s.name, m.name) for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods],
)
def test_every_method_has_a_rule_scoped_to_publications(service: str, method: str) -> None:
    """Each method resolves to a rule; a rule open to non-admin tokens names the
    request field (or first stream message) carrying the publication it reaches."""
    desc = pb.DESCRIPTOR.services_by_name[service]
    m = desc.methods_by_name[method]
    path = f"/{desc.full_name}/{m.name}"
    interceptor = AuthInterceptor(TokenBook([]), SERVED_BY[service])
    rule = interceptor.rule_for(path)
    assert rule is not None, f"{path} has no authorisation rule"
    assert not interceptor.is_public(path)
    assert rule.roles, f"{path}: a rule nobody may pass"
    if rule.roles - {"admin"}:
        assert rule.scoped, f"{path} is open to {sorted(rule.roles)} tokens for every publication"
    fields = m.input_type.fields_by_name
    if rule.publication:
        assert not m.client_streaming, f"{path}: stream requests are checked in_stream"
        assert rule.publication in fields, f"{path}: no request field {rule.publication!r}"
    if rule.subscriber:
        assert rule.subscriber in fields, f"{path}: no request field {rule.subscriber!r}"
    if rule.in_stream:
        assert m.client_streaming, f"{path}: in_stream on a unary request"


def test_public_services_are_health_and_reflection_only() -> None:
    """Open by design, and nothing else: health checking and reflection."""
    assert set(PUBLIC_SERVICES) == {
        health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
        reflection.SERVICE_NAME,
    }


def test_no_rule_keys_name_a_method_that_does_not_exist() -> None:
    """A stale or misspelt rule would leave the real method to its service prefix."""
    known = {
        f"/{s.full_name}/{m.name}"
        for s in pb.DESCRIPTOR.services_by_name.values()
        for m in s.methods
    } | {f"/{s.full_name}/" for s in pb.DESCRIPTOR.services_by_name.values()}
    for rules in (PUBLISHER_RULES, CONTROL_RULES):
        assert set(rules) <= known, set(rules) - known


async def test_a_method_without_a_rule_is_refused_even_with_a_valid_token() -> None:
    """Fail closed: a real server with a method no rule names answers PERMISSION_DENIED,
    and the method's code never runs; health stays open."""
    from grpc_health.v1 import health, health_pb2_grpc

    ran: list[bytes] = []

    async def unruled(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        ran.append(request)
        return b"secret"

    book = TokenBook([(hash_token("admin-token"), Principal("admin", "admin"))])
    server = grpc.aio.server(interceptors=[AuthInterceptor(book, PUBLISHER_RULES)])
    server.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "txrepl.v1.Replication", {"Unruled": grpc.unary_unary_rpc_method_handler(unruled)}
            )
        ]
    )
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            call: Any = ch.unary_unary("/txrepl.v1.Replication/Unruled")
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await call(b"x", metadata=(("x-txrepl-token", "admin-token"),), timeout=5)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "no authorisation rule" in (e.value.details() or "")
            probe = health_pb2_grpc.HealthStub(ch)
            resp = await probe.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert ran == []
    finally:
        await server.stop(None)

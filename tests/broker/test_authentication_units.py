"""The authentication parts without a broker: Kafka's principal mapping rules, the
certificate principal, the listener authenticator's answers to each kind of caller, the
token file, the broker's SCRAM handshake and its bounded tables, and the flags' checks.

The authenticator is given a stand-in for gRPC's servicer context (what a call's metadata
and TLS peer say); everything else is the real code.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from raftmq import scram
from raftmq.api.v1 import authentication_pb2 as apb
from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker import scram_service, token_file
from raftmq.broker.authentication import (
    AuthenticationSettings,
    CertificatePrincipals,
    ListenerAuthenticator,
    certificate_name,
    parse_methods,
)
from raftmq.broker.principal_rules import (
    MappingRuleError,
    NoMatchingRule,
    parse_rules,
    principal_name,
)
from raftmq.broker.refusals import Refusal
from raftmq.broker.scram_service import ScramService
from raftmq.broker.token_file import TokenFile, TokenFileError, token_line
from raftmq.controller.scram_users import ScramCredential
from raftmq.devtools import certs

# --- mapping rules (Kafka's documented examples) ---------------------------------------

KAFKA_RULES = (
    r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
    r"RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
    r"RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U,"
    r"DEFAULT"
)


@pytest.mark.parametrize(
    ("dn", "name"),
    [
        ("CN=kafka1,OU=ServiceUsers,O=Org,C=US", "kafka1"),
        ("CN=Duke,OU=JavaSoft,O=Sun Microsystems,L=Palo Alto,ST=CA,C=US", "duke@javasoft"),
        ("cn=duke,ou=javasoft,dc=sun,dc=com", "DUKE@JAVASOFT"),
        ("CN=other,O=elsewhere", "CN=other,O=elsewhere"),
    ],
)
def test_kafkas_examples_map_as_kafka_documents(dn: str, name: str) -> None:
    assert principal_name(parse_rules(KAFKA_RULES), dn) == name


def test_no_rules_is_default_and_no_match_names_nobody() -> None:
    assert principal_name(parse_rules(""), "CN=a,O=b") == "CN=a,O=b"
    with pytest.raises(NoMatchingRule):
        principal_name(parse_rules(r"RULE:^CN=(x)$/$1/"), "CN=y")


def test_an_escaped_slash_belongs_to_the_pattern() -> None:
    rules = parse_rules(r"RULE:^CN=([^,]*)\/dev,.*$/$1-dev/")
    assert principal_name(rules, "CN=svc/dev,O=x") == "svc-dev"


@pytest.mark.parametrize("bad", ["RULE:nope", "RULE:^(a$/x/", "SOMETHING", "RULE:a/b/Q"])
def test_rules_that_do_not_parse_are_refused_at_start(bad: str) -> None:
    with pytest.raises(MappingRuleError, match="ssl-principal-mapping-rules"):
        parse_rules(bad)


def test_a_certificates_subject_is_read_in_rfc_2253_order(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path)
    alice = certs.issue(ca, tmp_path, "alice", common_name="Alice")
    pem = alice.cert_file.read_bytes()
    default = CertificatePrincipals(parse_rules(""))
    assert default.of({"x509_pem_cert": [pem]}) == "User:CN=Alice,O=raftmq local"
    lowered = CertificatePrincipals(parse_rules(r"RULE:^CN=([^,]+),.*$/$1/L"))
    assert lowered.of({"x509_pem_cert": [pem]}) == "User:alice"
    assert (
        CertificatePrincipals(parse_rules(r"RULE:^CN=bob,.*$/bob/")).of({"x509_pem_cert": [pem]})
        is None
    )
    assert default.of({}) is None


def test_a_certificate_without_a_subject_is_named_by_its_alternative_name() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")]))
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier("spiffe://acme/ns/prod/sa/billing")]
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    assert certificate_name(cert) == "spiffe://acme/ns/prod/sa/billing"
    rules = parse_rules(r"RULE:^spiffe:\/\/acme\/ns\/([^\/]+)\/sa\/([^\/]+)$/$2.$1/")
    assert principal_name(rules, certificate_name(cert)) == "billing.prod"


# --- the authenticator -----------------------------------------------------------------


class Call:
    """A stand-in for grpc.aio.ServicerContext: a call's metadata and TLS peer."""

    def __init__(
        self,
        metadata: Sequence[tuple[str, str]] = (),
        auth: Mapping[str, list[bytes]] | None = None,
    ) -> None:
        self.metadata = tuple(metadata)
        self.auth = dict(auth or {})

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self.metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self.auth


def refusal(authenticator: ListenerAuthenticator, rpc: str, call: Call) -> Refusal:
    with pytest.raises(Refusal) as caught:
        asyncio.run(authenticator.authenticate(rpc, call))  # type: ignore[arg-type]
    assert caught.value.status == grpc.StatusCode.UNAUTHENTICATED
    return caught.value


def principal(authenticator: ListenerAuthenticator, rpc: str, call: Call) -> str:
    return asyncio.run(authenticator.authenticate(rpc, call))  # type: ignore[arg-type]


TOKEN = "a-good-token-of-some-length"


@pytest.fixture
def tokens(tmp_path: Path) -> TokenFile:
    path = tmp_path / "tokens"
    path.write_text(token_line("User:robot", TOKEN))
    return TokenFile(path)


@pytest.fixture
def broker_pem(tmp_path: Path) -> bytes:
    ca = certs.make_ca(tmp_path)
    return certs.issue(ca, tmp_path, "broker", common_name="raftmq broker").cert_file.read_bytes()


def test_each_caller_without_good_credentials_is_told_what_the_listener_expects(
    tokens: TokenFile, broker_pem: bytes
) -> None:
    sessions = ScramService(dict)
    auth = ListenerAuthenticator(("scram-sha-256", "oauthbearer"), tokens=tokens, sessions=sessions)
    none = refusal(auth, "Produce", Call())
    assert none.code == pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM
    assert "carries no credentials" in none.message
    assert "SCRAM-SHA-256" in none.message and "OAUTHBEARER" in none.message
    shape = refusal(auth, "Produce", Call([("authorization", "Bearer a b c")]))
    assert shape.code == pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM
    assert "not of the shape" in shape.message
    unknown = refusal(auth, "Produce", Call([("authorization", "Bearer " + "z" * 30)]))
    assert unknown.code == pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED
    expired = refusal(auth, "Produce", Call([("authorization", "Session nope")]))
    assert (
        expired.code == pb.ERROR_CODE_SESSION_EXPIRED and expired.status.name == "UNAUTHENTICATED"
    )
    basic = refusal(auth, "Produce", Call([("authorization", "Basic dXNlcjpwdw==")]))
    assert basic.code == pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM and "'Basic'" in basic.message
    # A certificate alone is no client login without mtls, except for inter-broker RPCs.
    with_cert = Call(auth={"x509_pem_cert": [broker_pem]})
    assert refusal(auth, "Produce", with_cert).code == pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM
    assert principal(auth, "RegisterBroker", with_cert) == "User:CN=raftmq broker,O=raftmq local"
    assert principal(auth, "Produce", Call([("authorization", "Bearer " + TOKEN)])) == "User:robot"
    assert principal(auth, "ScramClientFirst", Call()) == "User:ANONYMOUS"


def test_mtls_takes_the_mapped_certificate_and_refuses_an_unmapped_one(broker_pem: bytes) -> None:
    auth = ListenerAuthenticator(("mtls",), rules=parse_rules(r"RULE:^CN=raftmq (\w+),.*$/$1/"))
    assert principal(auth, "Fetch", Call(auth={"x509_pem_cert": [broker_pem]})) == "User:broker"
    other = ListenerAuthenticator(("mtls",), rules=parse_rules(r"RULE:^CN=alice,.*$/alice/"))
    unmapped = refusal(other, "Fetch", Call(auth={"x509_pem_cert": [broker_pem]}))
    assert unmapped.code == pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED
    assert "matches no rule" in unmapped.message


def test_the_flags_are_checked_together(tmp_path: Path) -> None:
    assert parse_methods("SCRAM-SHA-256, oauthbearer,mtls") == (
        "scram-sha-256",
        "oauthbearer",
        "mtls",
    )
    with pytest.raises(ValueError, match="unknown method 'plain'"):
        parse_methods("plain")
    with pytest.raises(ValueError, match="needs mutual TLS"):
        AuthenticationSettings(("scram-sha-256",)).check(mutual_tls=False)
    with pytest.raises(ValueError, match="go together"):
        AuthenticationSettings(("oauthbearer",)).check(mutual_tls=True)
    AuthenticationSettings().check(mutual_tls=False)  # off: nothing needed


# --- the token file --------------------------------------------------------------------


def test_the_token_file_holds_digests_is_checked_and_is_reloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tokens"
    path.write_text("# comment\n\n" + token_line("robot", TOKEN))
    assert TOKEN not in path.read_text()
    tokens = TokenFile(path)
    assert tokens.principal(TOKEN) == "User:robot"
    assert tokens.principal("other-token-of-some-length") is None
    monkeypatch.setattr(token_file, "CHECK_EVERY_S", 0.0)
    path.write_text(token_line("User:robot2", TOKEN) + "\n")
    assert tokens.principal(TOKEN) == "User:robot2"
    path.write_text("not a line\n")  # a bad edit keeps the last good tokens
    assert tokens.principal(TOKEN) == "User:robot2"
    with pytest.raises(TokenFileError, match=":1: expected 'PRINCIPAL SHA256HEX'"):
        TokenFile(path)


# --- the broker's SCRAM handshake --------------------------------------------------------


def _users(password: str) -> dict[str, ScramCredential]:
    import base64

    c = scram.credential(password, iterations=4096)

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {"alice": ScramCredential(4096, b64(c.salt), b64(c.stored_key), b64(c.server_key))}


def _login(service: ScramService, name: str, password: str) -> apb.ScramClientFinalResponse:
    async def run() -> apb.ScramClientFinalResponse:
        nonce = scram.new_nonce()
        first, bare = scram.client_first(name, nonce)
        server_first = (
            await service.ScramClientFirst(
                apb.ScramClientFirstRequest(mechanism="SCRAM-SHA-256", message=first),
                None,  # type: ignore[arg-type]
            )
        ).message
        combined, salt, iterations = scram.parse_server_first(server_first, nonce)
        final, _ = scram.client_final(password, bare, server_first, combined, salt, iterations)
        return await service.ScramClientFinal(
            apb.ScramClientFinalRequest(message=final),
            None,  # type: ignore[arg-type]
        )

    return asyncio.run(run())


def test_a_session_is_a_lookup_that_expires() -> None:
    service = ScramService(lambda: _users("pw"), session_lifetime_s=0.2)
    answer = _login(service, "alice", "pw")
    assert service.principal(answer.session_token) == "User:alice"
    time.sleep(0.3)
    assert service.principal(answer.session_token) is None


def test_unknown_users_and_wrong_passwords_are_told_the_same() -> None:
    service = ScramService(lambda: _users("pw"))
    answers = []
    for name, password in (("alice", "wrong"), ("mallory", "pw")):
        with pytest.raises(Refusal) as caught:
            _login(service, name, password)
        answers.append((caught.value.code, caught.value.message))
    assert answers[0] == answers[1]
    assert answers[0][0] == pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED


def test_the_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scram_service, "MAX_PENDING", 5)
    service = ScramService(lambda: _users("pw"), max_sessions=3)

    async def firsts(count: int) -> None:
        for _ in range(count):
            first, _ = scram.client_first("alice", scram.new_nonce())
            await service.ScramClientFirst(
                apb.ScramClientFirstRequest(mechanism="SCRAM-SHA-256", message=first),
                None,  # type: ignore[arg-type]
            )

    asyncio.run(firsts(50))
    assert len(service._pending) <= 5
    tokens = [_login(service, "alice", "pw").session_token for _ in range(6)]
    assert len(service._sessions) == 3
    assert service.principal(tokens[0]) is None and service.principal(tokens[-1]) == "User:alice"


def test_a_message_that_is_no_scram_message_is_malformed() -> None:
    service = ScramService(lambda: _users("pw"))
    for message in ("garbage", "n,,n=alice,r=" + "x" * 2000):
        with pytest.raises(Refusal) as caught:
            asyncio.run(
                service.ScramClientFirst(
                    apb.ScramClientFirstRequest(mechanism="SCRAM-SHA-256", message=message),
                    None,  # type: ignore[arg-type]
                )
            )
        assert caught.value.code == pb.ERROR_CODE_MALFORMED_REQUEST
    with pytest.raises(Refusal) as mechanism:
        asyncio.run(
            service.ScramClientFirst(
                apb.ScramClientFirstRequest(mechanism="PLAIN", message="n,,n=a,r=b"),
                None,  # type: ignore[arg-type]
            )
        )
    assert mechanism.value.code == pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM

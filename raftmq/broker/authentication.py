"""Who calls the client listener: the Authenticator a broker's guard uses
(raftmq.broker.guard) when ``raftmq broker --authentication`` names methods.

The methods, Kafka's in substance:

- ``mtls``: the principal of the verified client certificate, ``User:`` and its subject DN
  (or, when the subject is empty, its first subject alternative name) as the mapping
  rules make it (raftmq.broker.principal_rules, Kafka's ``ssl.principal.mapping.rules``);
- ``scram-sha-256``: the client proves a password with the SCRAM-SHA-256 handshake of the
  Authentication service (raftmq.broker.scram_service) and then sends the session token it
  got as ``authorization: Session TOKEN``;
- ``oauthbearer``: ``authorization: Bearer TOKEN``, checked against the token file
  (raftmq.broker.token_file).

A call that carries an ``authorization`` header is judged by it alone, so a SCRAM or token
client on a mutual-TLS listener acts as its user, not as its certificate. A call without
one is judged by its certificate when ``mtls`` is on; otherwise it is refused, with a
sentence naming the methods the listener expects. The handshake's own RPCs are let
through: they are how a client authenticates.

Brokers and controllers call each other's client listeners (registration, heartbeats and
the metadata watch, leader reports, history probes, transaction markers, delayed messages'
moves, topic auto-creation). They authenticate by their certificates, whatever client
methods are on: authentication needs mutual TLS on the client listener (``--tls-client-
auth``, checked at start), and a certificate the cluster's CA signed is always accepted
for the inter-broker RPCs (:data:`INTER_BROKER_RPCS`), as the broker's own principal (its
certificate's, mapped by the same rules), which ACLs can name as a super user. Why the
certificate rather than a credential of the broker's own: it needs no secret that every
broker shares and no user that must exist before the controller that stores users has a
leader (registration comes first), and every broker of a TLS cluster already holds one.
The cost: a client with a certificate from the cluster's CA may call those RPCs as its
certificate's principal without the listener's client methods; authorization (ACLs)
decides what it may do there.

Cheap on the request path: a session or a known token is a dict lookup, a certificate's
principal is remembered per certificate (the PEM bytes as key), never parsed per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc
from cryptography import x509

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.principal_rules import NoMatchingRule, Rule, parse_rules, principal_name
from raftmq.broker.refusals import Refusal
from raftmq.broker.token_file import TOKEN_SHAPE, TokenFile
from raftmq.log_records import ANONYMOUS

MTLS = "mtls"
SCRAM = "scram-sha-256"
OAUTHBEARER = "oauthbearer"
METHODS = (MTLS, SCRAM, OAUTHBEARER)
"""The methods ``--authentication`` takes, as a person names them."""

AUTHORIZATION = "authorization"
"""The gRPC metadata key of a call's credentials: ``Bearer TOKEN`` or ``Session TOKEN``."""
BEARER = "Bearer"
SESSION = "Session"

HANDSHAKE_RPCS = frozenset({"ScramClientFirst", "ScramClientFinal"})
"""The Authentication service's RPCs: open to everyone, they establish the credentials."""
INTER_BROKER_RPCS = frozenset(
    {
        # raftmq.v1.Controller: registration, heartbeats, the metadata watch and the rest
        "RegisterBroker",
        "Heartbeat",
        "WatchMetadata",
        "ReportLeader",
        "PromoteReplica",
        "DescribeVoter",
        "AllocateProducerIds",
        # the Broker and Admin RPCs brokers call on each other
        "Metadata",
        "WriteTxnMarkers",
        "ProduceDelayed",
        "ProduceInternal",
        "CreateTopic",
    }
)
"""RPCs a broker calls on its peers: a verified certificate is always accepted for them."""

PEM_CERT = "x509_pem_cert"
REMEMBERED_CERTS = 1_000


class Sessions(Protocol):
    def principal(self, token: str) -> str | None:
        """The principal of a live session, or None (unknown or expired)."""
        ...


def parse_methods(text: str | Iterable[str]) -> tuple[str, ...]:
    """The methods of ``--authentication`` (comma-separated; Kafka's mechanism names
    SCRAM-SHA-256 and OAUTHBEARER are taken too, in any case). Raises ValueError."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[str] = []
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item not in METHODS:
            raise ValueError(
                f"--authentication: unknown method {item!r}; known: {', '.join(METHODS)}"
            )
        if item not in out:
            out.append(item)
    return tuple(out)


@dataclass(frozen=True)
class AuthenticationSettings:
    """A broker's authentication flags, checked (:meth:`check`) before it starts."""

    methods: tuple[str, ...] = ()
    mapping_rules: str = ""
    token_file: Path | None = None
    session_lifetime_s: float = 3600.0
    """How long a SCRAM session lasts (Kafka's connections.max.reauth.ms)."""

    @property
    def enabled(self) -> bool:
        return bool(self.methods)

    def check(self, *, mutual_tls: bool) -> None:
        """Raises ValueError saying which flag is missing or wrong."""
        parse_rules(self.mapping_rules)
        if not self.enabled:
            if self.token_file is not None:
                raise ValueError("--token-file needs --authentication with oauthbearer")
            return
        if not mutual_tls:
            raise ValueError(
                "--authentication needs mutual TLS on the client listener (--tls-ca, "
                "--tls-cert, --tls-key and --tls-client-auth): brokers authenticate each "
                "other there by their certificates (docs/security.md)"
            )
        if (OAUTHBEARER in self.methods) != (self.token_file is not None):
            raise ValueError(
                "--authentication oauthbearer and --token-file go together: the token file "
                "holds the tokens the listener accepts"
            )
        if self.token_file is not None:
            TokenFile(self.token_file)  # raises TokenFileError (a ValueError) naming the line


class CertificatePrincipals:
    """The principal of a verified client certificate, remembered per certificate."""

    def __init__(self, rules: tuple[Rule, ...]) -> None:
        self.rules = rules
        self._known: dict[bytes, str | None] = {}

    def of(self, auth: Mapping[str, Sequence[bytes]]) -> str | None:
        """``User:NAME`` for the certificate in ``auth`` (a call's auth context); None when
        there is none or no rule matches its subject."""
        pems = auth.get(PEM_CERT)
        if not pems:
            return None
        pem = pems[0]
        if pem in self._known:
            return self._known[pem]
        principal = self._map(pem)
        if len(self._known) >= REMEMBERED_CERTS:
            self._known.clear()
        self._known[pem] = principal
        return principal

    def _map(self, pem: bytes) -> str | None:
        name = certificate_name(x509.load_pem_x509_certificate(pem))
        try:
            return "User:" + principal_name(self.rules, name)
        except NoMatchingRule:
            return None


def certificate_name(cert: x509.Certificate) -> str:
    """What the mapping rules apply to: the subject DN in RFC 2253 order, or for a
    certificate whose subject is empty (SPIFFE's, say) its first subject alternative name
    that names someone (a URI, an e-mail address or a DNS name), as it is written."""
    dn = cert.subject.rfc4514_string()
    if dn:
        return dn
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    for general in names:
        if isinstance(general, x509.UniformResourceIdentifier | x509.RFC822Name | x509.DNSName):
            return str(general.value)
    return ""


class ListenerAuthenticator:
    """The client listener's Authenticator (raftmq.broker.guard)."""

    def __init__(
        self,
        methods: tuple[str, ...],
        *,
        rules: tuple[Rule, ...] = (Rule(None),),
        tokens: TokenFile | None = None,
        sessions: Sessions | None = None,
    ) -> None:
        assert methods, "an authenticator needs a method; without one, pass no authenticator"
        self.methods = methods
        self.certificates = CertificatePrincipals(rules)
        self.tokens = tokens
        self.sessions = sessions

    def expected(self) -> str:
        """The sentence that tells a caller how this listener authenticates."""
        how = []
        if SCRAM in self.methods:
            how.append(
                "SCRAM-SHA-256 (sasl_mechanism='SCRAM-SHA-256' with sasl_username and "
                "sasl_password)"
            )
        if OAUTHBEARER in self.methods:
            how.append("OAUTHBEARER (sasl_mechanism='OAUTHBEARER' with sasl_oauth_token)")
        if MTLS in self.methods:
            how.append("a client certificate signed by the cluster's CA (ssl_certfile)")
        return f"this listener expects {' or '.join(how)}"

    async def authenticate(self, rpc: str, context: grpc.aio.ServicerContext) -> str:
        if rpc in HANDSHAKE_RPCS:
            return ANONYMOUS
        header = _authorization(context.invocation_metadata())
        if header is not None:
            return self._by_header(header)
        if MTLS in self.methods or rpc in INTER_BROKER_RPCS:
            auth = context.auth_context()
            principal = self.certificates.of(auth)
            if principal is not None:
                return principal
            if MTLS in self.methods and auth.get(PEM_CERT):
                raise Refusal(
                    pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED,
                    "the client certificate's subject matches no rule of the broker's "
                    "--ssl-principal-mapping-rules, so it names no principal; " + self.expected(),
                )
        raise Refusal(
            pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM,
            f"the call carries no credentials; {self.expected()}",
        )

    def _by_header(self, header: str) -> str:
        scheme, _, credential = header.strip().partition(" ")
        credential = credential.strip()
        if scheme == BEARER and OAUTHBEARER in self.methods and self.tokens is not None:
            if not TOKEN_SHAPE.fullmatch(credential):
                raise Refusal(
                    pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM,
                    "the bearer token is not of the shape of one: 16 to 4096 characters of "
                    "A-Z a-z 0-9 - . _ ~ + / (then '=' padding), sent as 'authorization: "
                    "Bearer TOKEN'; give sasl_oauth_token the token itself",
                )
            principal = self.tokens.principal(credential)
            if principal is None:
                raise Refusal(
                    pb.ERROR_CODE_SASL_AUTHENTICATION_FAILED,
                    "Authentication failed: the bearer token is not in this broker's token "
                    "file (unknown, or revoked); ask the operator for a valid token",
                )
            return principal
        if scheme == SESSION and SCRAM in self.methods and self.sessions is not None:
            principal = self.sessions.principal(credential)
            if principal is None:
                raise Refusal(
                    pb.ERROR_CODE_SESSION_EXPIRED,
                    "the SCRAM session is unknown to this broker (it expired, or the broker "
                    "restarted): authenticate again with SCRAM-SHA-256, then resend",
                )
            return principal
        shown = scheme[:20] or "(empty)"
        raise Refusal(
            pb.ERROR_CODE_UNSUPPORTED_SASL_MECHANISM,
            f"the call's authorization header uses {shown!r}, which this listener does "
            f"not accept; {self.expected()}",
        )


def _authorization(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
    for key, value in metadata or ():
        if key == AUTHORIZATION:
            return value if isinstance(value, str) else value.decode(errors="replace")
    return None


def listener_authenticator(
    settings: AuthenticationSettings, sessions: Sessions | None = None
) -> ListenerAuthenticator | None:
    """The authenticator ``settings`` ask for (None: authentication off, nothing to pay)."""
    if not settings.enabled:
        return None
    tokens = TokenFile(settings.token_file) if settings.token_file is not None else None
    return ListenerAuthenticator(
        settings.methods,
        rules=parse_rules(settings.mapping_rules),
        tokens=tokens,
        sessions=sessions,
    )

"""Why a TLS connection failed, in words a person can act on.

gRPC reports every failed connection as UNAVAILABLE, its reason buried in the details
("Tls handshake failed ... CERTIFICATE_VERIFY_FAILED: certificate has expired"). A client
that only says "unavailable" sends its user looking for a broker that is down, and worse,
retries what will never work. So each refusal TLS gives is read off the details here, once:
its own label, a status (UNAUTHENTICATED when this client cannot trust the broker's
certificate, UNAVAILABLE when the broker closed the connection in its handshake) and a
sentence that says what to change. A refusal that can only be a TLS one has a label, so
clients raise it at once instead of retrying (ClientError.unreachable is false for it). A
broker that closes a connection in its handshake may also just be stopping: that one keeps
no label (clients retry it as any unreachable broker) and only gains the sentence, said
as an "if".

The broker's side of a refused handshake is nothing: no request reached it, nothing was
written, and it goes on serving everyone else.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class TlsRefusal:
    label: str
    """Empty when the failure may be no TLS one (then it stays retriable)."""
    status: grpc.StatusCode
    sentence: str


_UNTRUSTED = grpc.StatusCode.UNAUTHENTICATED
_CLOSED = grpc.StatusCode.UNAVAILABLE

_REFUSALS: tuple[tuple[tuple[str, ...], TlsRefusal], ...] = (
    (
        ("certificate has expired", "certificate is not yet valid"),
        TlsRefusal(
            "TLS_CERTIFICATE_EXPIRED",
            _UNTRUSTED,
            "The broker's TLS certificate has expired (or is not valid yet): its operator "
            "must install a current one (the broker re-reads its certificate files).",
        ),
    ),
    (
        ("self signed certificate", "self-signed certificate"),
        TlsRefusal(
            "TLS_CERTIFICATE_SELF_SIGNED",
            _UNTRUSTED,
            "The broker presents a self-signed TLS certificate that ssl_cafile (--tls-ca) "
            "does not hold: give the CA file that signed the broker's certificate.",
        ),
    ),
    (
        (
            "unable to get local issuer certificate",
            "unable to get issuer certificate",
            "certificate signature failure",
            "BAD_SIGNATURE",
        ),
        TlsRefusal(
            "TLS_UNKNOWN_CA",
            _UNTRUSTED,
            "The broker's TLS certificate is not signed by the CA in ssl_cafile (--tls-ca): "
            "give the CA file that signed it.",
        ),
    ),
    (
        ("Hostname Verification Check failed", "IP address mismatch", "Hostname mismatch"),
        TlsRefusal(
            "TLS_WRONG_HOST",
            _UNTRUSTED,
            "The broker's TLS certificate does not name the address this client dialled: "
            "connect by a host name or IP address the certificate lists, or have it "
            "re-issued with this one among its subject alternative names.",
        ),
    ),
    (
        ("WRONG_VERSION_NUMBER", "http_request", "HTTP_REQUEST"),
        TlsRefusal(
            "TLS_NOT_SPOKEN",
            _CLOSED,
            "The broker did not answer in TLS: its listener is plaintext, so drop the "
            "ssl_ settings (--tls-*) or connect to its TLS listener.",
        ),
    ),
    (
        ("Socket closed", "Connection reset by peer"),
        TlsRefusal(
            "",
            _CLOSED,
            "The broker closed the connection while it was being set up: if its listener "
            "uses TLS, give this client ssl_cafile (--tls-ca); if it requires client "
            "certificates (mutual TLS), give ssl_certfile and ssl_keyfile (--tls-cert, "
            "--tls-key) signed by the CA it trusts.",
        ),
    ),
)


def tls_refusal(details: str) -> TlsRefusal | None:
    """The refusal gRPC's UNAVAILABLE ``details`` describe, or None when they describe
    none (a broker that is down, say)."""
    if "failed to connect to all addresses" not in details:
        return None  # a call that broke mid-way, not a connection that never opened
    for needles, refusal in _REFUSALS:
        if any(n in details for n in needles):
            return refusal
    return None

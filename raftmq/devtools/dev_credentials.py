"""The credentials of a ``raftmq dev --secure`` cluster, made once under ``DATA/tls`` beside
its certificates, so a restart keeps them (and the clients configured for it keep
working):

- ``tokens.txt``, the brokers' token file (``--token-file``), holding the SHA-256 of
  ``admin.token``: a bearer token for ``User:admin``, what ``raftmq dev`` itself uses to
  reach the cluster before any SCRAM user exists (creating the first one needs it);
- ``admin.password``: the password of the SCRAM-SHA-256 user ``admin``, which ``raftmq
  dev`` stores in the cluster and writes into ``DATA/client.toml``.

The brokers authenticate each other by their certificate (mutual TLS); clients log in with
SCRAM-SHA-256 or a bearer token (docs/security.md).
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from raftmq.api.v1 import broker_pb2 as pb
from raftmq.broker.token_file import token_line
from raftmq.client import LowLevelClient
from raftmq.client.sasl import SaslSettings
from raftmq.devtools.certs import LocalPki, local_pki
from raftmq.devtools.local_cluster import LocalCluster, acl_broker_args

ADMIN = "admin"
CLIENT_METHODS = "scram-sha-256,oauthbearer"
CN_RULE = "RULE:^CN=([^,]+)(,.*)?$/$1/,DEFAULT"
"""A certificate's principal is ``User:`` and its common name (``User:raftmq broker``), as
the ACLs' super users name the brokers (raftmq.devtools.local_cluster.acl_broker_args),
rather than Kafka's default, the whole subject DN."""


def _secret(path: Path) -> str:
    """The secret in ``path``, made (random, readable by its owner only) if absent."""
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(24)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(value + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return value


@dataclass(frozen=True)
class DevCredentials:
    token_file: Path
    admin_token: str
    admin_password: str

    @property
    def broker_args(self) -> list[str]:
        """The brokers' flags: SCRAM and tokens for clients (and their certificates among
        themselves)."""
        return [
            *("--authentication", CLIENT_METHODS),
            *("--token-file", str(self.token_file)),
            *("--ssl-principal-mapping-rules", CN_RULE),
        ]

    @property
    def bearer(self) -> SaslSettings:
        """What ``raftmq dev``'s own clients authenticate with."""
        return SaslSettings(sasl_mechanism="OAUTHBEARER", sasl_oauth_token=self.admin_token)

    @property
    def scram(self) -> SaslSettings:
        """What the client configuration file says: the SCRAM user ``admin``."""
        return SaslSettings(
            sasl_mechanism="SCRAM-SHA-256",
            sasl_username=ADMIN,
            sasl_password=self.admin_password,
        )


def dev_credentials(folder: Path) -> DevCredentials:
    """The credentials under ``folder`` (``DATA/tls``), made the first time."""
    token = _secret(folder / "admin.token")
    password = _secret(folder / "admin.password")
    token_file = folder / "tokens.txt"
    line = token_line(f"User:{ADMIN}", token)
    if not token_file.exists() or token_file.read_text() != line:
        token_file.write_text(line)
    return DevCredentials(token_file, token, password)


def store_admin(
    cluster: LocalCluster, credentials: DevCredentials, timeout_s: float = 30.0
) -> None:
    """Store the SCRAM user ``admin`` (again, on a restart: the same password), and wait
    until every broker takes its login (each applies the metadata on its own)."""
    with cluster.admin() as admin:
        admin.upsert_user_scram_credential(ADMIN, credentials.admin_password)
    settings = {**cluster.client_tls, **credentials.scram}
    deadline = time.monotonic() + timeout_s
    with LowLevelClient(cluster.addresses, retries=1, **settings) as client:  # type: ignore[arg-type]
        for address in cluster.addresses:
            while True:
                try:
                    client.stub(address).Metadata(pb.MetadataRequest(), timeout=5)
                    break
                except grpc.RpcError as exc:
                    if time.monotonic() > deadline:
                        raise TimeoutError(
                            f"the broker at {address} did not take the admin login within "
                            f"{timeout_s:.0f} s: {exc.details()}"
                        ) from None
                    time.sleep(0.05)


@dataclass(frozen=True)
class SecureCluster:
    """Everything a cluster needs to run as ``raftmq dev --secure`` runs one (what the chaos
    harness's ``--secure`` and ``produce_bench --secure`` start too, so that what they
    measure is what a user gets): TLS on every listener, mutual; clients authenticated by
    SCRAM-SHA-256 or bearer token, brokers by certificate; the ACL authorizer on, with the
    brokers and ``User:admin`` as super users."""

    pki: LocalPki
    credentials: DevCredentials

    @property
    def broker_args(self) -> list[str]:
        return [
            *self.credentials.broker_args,
            *acl_broker_args(self.pki, operators=(f"User:{ADMIN}",)),
        ]

    def cluster_settings(self) -> dict[str, Any]:
        """LocalCluster's keyword arguments besides ``broker_args``: its own clients log in
        as ``User:admin`` with the bearer token (no SCRAM user exists before one is
        stored: :func:`store_admin`)."""
        return {"pki": self.pki, "client_auth": True, "client_credentials": self.credentials.bearer}


def secure_cluster(folder: Path) -> SecureCluster:
    """The certificates and credentials under ``folder`` (``DATA/tls``), made once."""
    return SecureCluster(local_pki(folder), dev_credentials(folder))

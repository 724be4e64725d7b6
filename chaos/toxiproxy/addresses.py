"""Parsing and resolving ``host:port`` strings the way the Go server reports them."""

from __future__ import annotations

import ipaddress
import socket

from chaos.toxiproxy.errors import ApiError


def split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port`` or ``[v6]:port``; ports must be 0-65535.

    Raises ValueError rather than ApiError because callers map the failure to
    different statuses (400 for a body, 500 for a bind).
    """
    if address.startswith("["):
        end = address.find("]")
        if end < 0 or address[end + 1 : end + 2] != ":":
            raise ValueError(f"address {address}: missing port in address")
        host, port_text = address[1:end], address[end + 2 :]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(f"address {address}: missing port in address")
        if ":" in host:
            raise ValueError(f"address {address}: too many colons in address")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, int(port_text)


def join_host_port(host: str, port: int) -> str:
    """Format an address as Go does: IPv6 literals get brackets."""
    if ":" in host:
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def resolve_listen(address: str) -> tuple[socket.AddressFamily, str, int]:
    """Resolve a listen address to the concrete family, IP and port to bind.

    ``localhost`` must become ``127.0.0.1`` (IPv4 preferred, like Go's
    listener), and an empty host means every interface.
    """
    try:
        host, port = split_host_port(address)
    except ValueError as exc:
        raise ApiError(500, f"listen tcp {address}: {exc}") from exc
    if host == "":
        return socket.AF_INET, "0.0.0.0", port
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        return family, str(ip), port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ApiError(500, f"listen tcp {address}: lookup {host}: {exc.strerror}") from exc
    infos.sort(key=lambda info: info[0] != socket.AF_INET)
    family, _, _, _, sockaddr = infos[0]
    return socket.AddressFamily(family), str(sockaddr[0]), port


def same_listen(a: str, b: str) -> bool:
    """Whether two listen strings name the same socket address.

    Used to decide whether an update must restart the listener; an address
    that cannot be resolved is compared textually so the caller's later bind
    reports the real error.
    """
    if a == b:
        return True
    try:
        return resolve_listen(a) == resolve_listen(b)
    except ApiError:
        return False

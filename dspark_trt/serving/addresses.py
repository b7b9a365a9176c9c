"""The address a client dials for a server bound to ``host``.

    client_host("0.0.0.0")          '127.0.0.1'   (a wildcard bind listens on every address; this one reaches it)
    client_address("::", 8000)      '[::1]:8000'  (IPv6 in brackets, as URLs need)
    listens_everywhere("0.0.0.0")   True
    bind_note("0.0.0.0")            the ready line's note beside the usable URL ('' for a specific address)
    loopback("::")                  '::1'         (this machine only, in the family of the address given)
    triton_address("::1", "grpc")   '[::1]'       (how tritonserver's --grpc-address / --http-address /
    triton_address("::1", "http")   'ipv6:::1'     --metrics-address spell an IPv6 address)

``http://0.0.0.0:PORT/v1`` is what a server bound to every address would print, and no client can use it.
"""

from __future__ import annotations

__all__ = ["WILDCARD_HOSTS", "listens_everywhere", "client_host", "client_address", "bind_note", "loopback",
           "is_ipv6", "is_loopback", "triton_address"]

#: binds that listen on every address of their family (IPv4, IPv6)
WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1", "[::]": "::1"}


def listens_everywhere(host: str) -> bool:
    """Whether a server bound to ``host`` listens on every address (``0.0.0.0``, ``::``)."""
    return host in WILDCARD_HOSTS


def client_host(host: str) -> str:
    """The host a client on this machine dials: the loopback address of a wildcard bind's family, else ``host``."""
    return WILDCARD_HOSTS.get(host, host).strip("[]")


def client_address(host: str, port: int) -> str:
    """``HOST:PORT`` a client can dial (an IPv6 address in brackets)."""
    host = client_host(host)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_note(host: str) -> str:
    """The ready line's note for a wildcard bind ('' otherwise): the URLs shown are this machine's loopback."""
    if not listens_everywhere(host):
        return ""
    return (f"listening on all addresses ({host or '0.0.0.0'}): the URLs above are for this machine; from another "
            f"machine use this host's name or address")


def is_ipv6(host: str) -> bool:
    """Whether ``host`` is an IPv6 address (``::1``, ``[::]``); a name or an IPv4 address is not."""
    return ":" in host


def loopback(host: str) -> str:
    """This machine's loopback address in ``host``'s family: ``::1`` for an IPv6 address, else ``127.0.0.1``."""
    return "::1" if is_ipv6(host) else "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether a bind to ``host`` is reachable from this machine only."""
    import ipaddress

    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def triton_address(host: str, endpoint: str) -> str:
    """``host`` as tritonserver's ``--{endpoint}-address`` takes it. tritonserver appends ``:PORT`` to the gRPC
    address (an IPv6 one needs brackets, else it cannot listen) and hands the HTTP and metrics addresses to
    libevhtp (an IPv6 one needs the ``ipv6:`` prefix, else it binds 255.255.255.255)."""
    name = host.strip("[]")
    if not is_ipv6(name):
        return name
    return f"[{name}]" if endpoint == "grpc" else f"ipv6:{name}"

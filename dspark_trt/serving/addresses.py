"""The address a client dials for a server bound to ``host``.

    client_host("0.0.0.0")          '127.0.0.1'   (a wildcard bind listens on every address; this one reaches it)
    client_address("::", 8000)      '[::1]:8000'  (IPv6 in brackets, as URLs need)
    listens_everywhere("0.0.0.0")   True
    bind_note("0.0.0.0")            the ready line's note beside the usable URL ('' for a specific address)

``http://0.0.0.0:PORT/v1`` is what a server bound to every address would print, and no client can use it.
"""

from __future__ import annotations

__all__ = ["WILDCARD_HOSTS", "listens_everywhere", "client_host", "client_address", "bind_note"]

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

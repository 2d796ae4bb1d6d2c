"""Free TCP ports for tests that start servers (Ray nodes, MLflow, the Ray dashboard)."""
from __future__ import annotations

import socket

#: the services' default ports, never handed out (a stray default service would collide)
DEFAULT_PORTS = (5000, 6379, 8265, 10001, 52365)


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on every interface now, none of :data:`DEFAULT_PORTS`
    (all held open together while choosing, so they differ)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
            port = s.getsockname()[1]
            if port not in ports and port not in DEFAULT_PORTS:
                ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports

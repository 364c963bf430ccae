"""gRPC servers on unix sockets, as the kubelet and its plugins talk: one way to start one."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path
from typing import Any

import grpc


def start(add: Any, servicer: Any, socket: Path, workers: int = 4) -> grpc.Server:
    """Serve ``servicer`` on ``socket`` (a stale file there is replaced). ``add`` is the generated
    ``add_<Service>Servicer_to_server``, which is untyped."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    add(servicer, server)
    socket.unlink(missing_ok=True)
    if not server.add_insecure_port(f"unix://{socket.absolute()}"):
        raise OSError(f"cannot listen on {socket}")
    server.start()
    return server

"""A TCP proxy between the stores under test and the real server, to make outages.

``cut()`` makes the server unreachable the way a crash or a network fault does:
every open connection is reset (the client sees a lost connection, the server's
backend ends and its locks go), and every new connection is reset as soon as it
is accepted. With ``blackhole=True`` open and new connections stay open instead,
but nothing passes either way (calls hang, as behind a dead link); ``restore()``
resets them (the far side has long forgotten them) and lets traffic through
again. One selector thread moves the bytes; no mocks anywhere.
"""

from __future__ import annotations

import queue
import selectors
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from psycopg.conninfo import conninfo_to_dict, make_conninfo


def _reset(sock: socket.socket) -> None:
    """Close with an RST (SO_LINGER 0), not a FIN."""
    with suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to the server of ``dsn`` (over TCP or its Unix socket)."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        host = str(params.get("host") or "127.0.0.1").split(",")[0]
        port = int(params.get("port") or 5432)
        # A host starting with "/" is the directory of the server's Unix socket.
        self._unix = f"{host}/.s.PGSQL.{port}" if host.startswith("/") else None
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._peer: dict[socket.socket, socket.socket | None] = {}  # None: blackholed
        self._servers: set[socket.socket] = set()
        self._commands: queue.Queue[tuple[Callable[[], None], threading.Event]] = queue.Queue()
        self._mode = "up"  # "up", "reset" or "blackhole"
        self._closed = False
        self.accepted = 0
        self._thread = threading.Thread(target=self._loop, name="tcp-proxy", daemon=True)
        self._thread.start()

    def dsn(self, dsn: str) -> str:
        """``dsn`` through the proxy (a Unix socket host becomes this TCP port)."""
        return make_conninfo(dsn, host="127.0.0.1", hostaddr="127.0.0.1", port=str(self.port))

    @property
    def up(self) -> bool:
        return self._mode == "up"

    def cut(self, *, blackhole: bool = False) -> None:
        self._do(lambda: self._cut("blackhole" if blackhole else "reset"))

    def restore(self) -> None:
        self._do(self._restore)

    def close(self) -> None:
        self._do(self._close_all)
        self._thread.join(5)

    # --- the selector thread ------------------------------------------------------

    def _do(self, command: Callable[[], None]) -> None:
        done = threading.Event()
        self._commands.put((command, done))
        self._wake_w.send(b"x")
        assert done.wait(10), "the proxy thread did not answer"

    def _cut(self, mode: str) -> None:
        self._mode = mode
        if mode == "reset":
            for sock in list(self._peer):
                self._drop(sock)
        else:  # the server side goes (its backend ends); the client side hangs
            for server in list(self._servers):
                self._peer.pop(server, None)
                self._servers.discard(server)
                with suppress(KeyError, ValueError, OSError):
                    self._sel.unregister(server)
                _reset(server)
            for sock in self._peer:
                self._peer[sock] = None

    def _restore(self) -> None:
        for sock in list(self._peer):
            self._drop(sock)
        self._mode = "up"

    def _close_all(self) -> None:
        for sock in list(self._peer):
            self._drop(sock)
        self._closed = True

    def _drop(self, sock: socket.socket) -> None:
        self._servers.discard(sock)
        other = self._peer.pop(sock, None)
        with suppress(KeyError, ValueError, OSError):
            self._sel.unregister(sock)
        _reset(sock)
        if other is not None:
            self._drop(other)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        self.accepted += 1
        if self._mode == "reset":
            _reset(client)
            return
        client.setblocking(True)
        if self._mode == "blackhole":
            self._peer[client] = None
            self._sel.register(client, selectors.EVENT_READ)
            return
        try:
            server = self._connect()
        except OSError:
            _reset(client)
            return
        server.settimeout(None)
        self._peer[client], self._peer[server] = server, client
        self._servers.add(server)
        self._sel.register(client, selectors.EVENT_READ)
        self._sel.register(server, selectors.EVENT_READ)

    def _connect(self) -> socket.socket:
        if self._unix is None:
            return socket.create_connection(self._target, timeout=5)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.settimeout(5)
        try:
            server.connect(self._unix)
        except OSError:
            server.close()
            raise
        return server

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        other = self._peer.get(sock)
        if other is None:
            return  # blackholed
        try:
            other.sendall(data)
        except OSError:
            self._drop(sock)

    def _loop(self) -> None:
        while not self._closed:
            for key, _ in self._sel.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._listener:
                    self._accept()
                elif sock is self._wake_r:
                    sock.recv(4096)
                    while not self._commands.empty():
                        command, done = self._commands.get()
                        command()
                        done.set()
                elif sock in self._peer:
                    self._forward(sock)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._sel.close()


@contextmanager
def tcp_proxy(dsn: str) -> Iterator[TcpProxy]:
    proxy = TcpProxy(dsn)
    try:
        yield proxy
    finally:
        proxy.close()

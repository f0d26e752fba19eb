"""A bounded connection flood against listeners on 127.0.0.1 (issue 25's handshake tests).

``Flood(addresses, count, seconds)`` keeps ``count`` connections open from ``source``, spread over
``addresses``: half idle, half sending one TLS record-type byte every 0.3 s. A connection the
listener closes is opened again, until the ``with`` block ends or ``seconds`` have passed (the
flood stops by itself whatever happens); ``opened`` counts the connections made.
"""

from __future__ import annotations

import socket
import threading
import time


class Flood:
    """Keep connections open to each address (half idle, half one byte per 0.3 s)."""

    def __init__(self, addresses, count, seconds, source="127.0.0.2"):
        self.targets = [addresses[i % len(addresses)] for i in range(count)]
        self.seconds, self.source = seconds, source
        self.opened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self, address):
        sock = socket.socket()
        sock.bind((self.source, 0))
        sock.settimeout(1.0)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            return None
        sock.setblocking(False)
        self.opened += 1
        return sock

    def _run(self):
        end = time.monotonic() + self.seconds
        socks = [None] * len(self.targets)
        try:
            while not self.stop.is_set() and time.monotonic() < end:
                for i, sock in enumerate(socks):
                    if sock is None:
                        socks[i] = self._connect(self.targets[i])
                        continue
                    try:
                        if i % 2:  # slow-byte: a TLS record type byte now and then
                            sock.send(b"\x16")
                        elif sock.recv(1) == b"":  # idle: closed by the listener?
                            raise OSError("closed")
                    except BlockingIOError:
                        pass
                    except OSError:
                        sock.close()
                        socks[i] = None
                self.stop.wait(0.3)
        finally:
            for sock in socks:
                if sock is not None:
                    sock.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)

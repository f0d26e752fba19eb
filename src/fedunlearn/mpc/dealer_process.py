"""Launch the dealer as its own process: ``start_dealer_process`` and a command line.

The dealer (``dealer_service.DealerServer``) must run apart from both servers (it is a trusted
third party: MPC2 in docs/mpc.md), so a launcher such as ``fedunlearn starfish-local`` starts it
in a spawned child on loopback with an ephemeral port, reads the port back, and hands the
address to both servers::

    with start_dealer_process(Security(identity=ids["dealer"])) as dealer:  # stopped on exit
        ...  # start the two servers with dealer.address; each uses RemoteDealer.connect
        dealer.join(timeout_seconds=60)             # 0 once both servers said goodbye

By hand: ``python -m fedunlearn.mpc.dealer_process --port 0 --tls-dir DIR`` (a directory
written by ``python -m fedunlearn.mpc.identity DIR``; or ``--insecure`` for plain TCP) prints
``fedunlearn dealer listening on HOST:PORT`` and serves one session.

Pass the dealer a ``Security`` with its ``dealer`` identity so that only the servers holding
``server0``/``server1`` certificates of the same CA are served; ``Security.plain()`` runs
plain TCP (``identity.INSECURE_WARNING``); there is no default. A handle's ``join`` returns
the exit code: 0 after both servers said goodbye, 1 after a failure (the reason is on the
child's stderr).

The dealer stands in for ABY's own offline phase: MPC2 in docs/mpc.md, SF24 in
docs/methods/starfish.md; the material it derives is ``dealer.py``'s.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import weakref
from collections.abc import Sequence
from multiprocessing.process import BaseProcess

from fedunlearn.errors import ConfigError, FedUnlearnError, PeerDisconnectedError
from fedunlearn.mpc.dealer_service import DealerOptions, DealerServer
from fedunlearn.mpc.identity import INSECURE_WARNING
from fedunlearn.mpc.security import Security
from fedunlearn.mpc.session import SessionBinding

__all__ = ["DealerProcess", "main", "start_dealer_process"]


def _stop(process: BaseProcess, grace_seconds: float = 2.0) -> None:
    """Terminate a dealer process (kill it if it does not exit within the grace period)."""
    if process.is_alive():
        process.terminate()
        process.join(grace_seconds)
    if process.is_alive():
        process.kill()
        process.join(grace_seconds)


class DealerProcess:
    """Handle of a dealer running in a child process; stopped in a finaliser at the latest.

    Args:
        process: The child process running ``DealerServer.serve``.
        host: Address the dealer listens on.
        port: Its port.
    """

    def __init__(self, process: BaseProcess, host: str, port: int) -> None:
        self.process = process
        self.host, self.port = host, port
        self._finalizer = weakref.finalize(self, _stop, process)

    def __repr__(self) -> str:
        return f"DealerProcess(address={self.host}:{self.port}, alive={self.process.is_alive()})"

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) to pass to ``RemoteDealer.connect``."""
        return self.host, self.port

    def join(self, timeout_seconds: float | None = None) -> int | None:
        """Wait for the dealer to exit (0: both parties said goodbye); return its exit code."""
        self.process.join(timeout_seconds)
        return self.process.exitcode

    def stop(self) -> None:
        """Terminate the dealer now (a no-op if it has exited)."""
        self._finalizer()

    def __enter__(self) -> DealerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _dealer_child(conn, security: Security, listen: dict) -> None:  # noqa: ANN001 (a connection)
    """Entry point of the dealer process: bind, report the port, serve, exit 0 or 1."""
    try:
        server = DealerServer(security, **listen)
    except (OSError, ConfigError) as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    conn.send(("ok", server.port))
    conn.close()
    try:
        server.serve()
    except FedUnlearnError as exc:
        print(f"fedunlearn dealer: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)


def start_dealer_process(
    security: Security,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    seed: int | bytes | None = None,
    binding: SessionBinding | None = None,
    options: DealerOptions | None = None,
    start_timeout_seconds: float = 30.0,
) -> DealerProcess:
    """Start a ``DealerServer`` in a spawned child process and return once it listens.

    Args:
        security: The dealer's TLS identity (mutual TLS with roles: the secure setting), or
            ``Security.plain()`` (plain TCP, explicitly).
        host: Address to bind (loopback by default).
        port: Port, or 0 for an ephemeral one (read it from the handle's ``address``).
        seed: Master seed for reproducible tests; None: a fresh secret made in the child.
        binding: The session binding the servers must present (None: they must agree).
        options: The dealer's protocol option and bounds (default: ``DealerOptions()``).
        start_timeout_seconds: How long the child may take to start listening.

    Returns:
        The handle; use it as a context manager, or call ``stop()``, to end the process.

    Raises:
        PeerDisconnectedError: If the dealer did not start listening in time.
    """
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    listen = {"host": host, "port": port, "seed": seed, "binding": binding, "options": options}
    process = context.Process(
        target=_dealer_child,
        args=(sender, security, listen),
        name="fedunlearn-dealer",
        daemon=True,
    )
    process.start()
    handle = DealerProcess(process, host, 0)  # finaliser armed before we wait
    sender.close()
    status, value = "error", f"no answer within {start_timeout_seconds:g} s"
    try:
        if receiver.poll(start_timeout_seconds):
            status, value = receiver.recv()
    except EOFError:
        status, value = "error", f"the dealer process exited (code {process.exitcode})"
    finally:
        receiver.close()
    if status != "ok":
        handle.stop()
        raise PeerDisconnectedError(f"could not start the dealer on {host}:{port}: {value}")
    handle.port = int(value)
    return handle


def main(argv: Sequence[str] | None = None) -> int:
    """Run a dealer in this process: ``python -m fedunlearn.mpc.dealer_process --port 0``."""
    parser = argparse.ArgumentParser(description="The 2PC dealer (trusted third party).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--seed", type=int, default=None, help="tests only; default: secrets")
    parser.add_argument("--mask-scale-bits", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--idle-timeout", type=float, default=3600.0)
    parser.add_argument("--tls-dir", default=None, help="trial PKI directory (dealer.pem/.key)")
    parser.add_argument("--session", default=None, help="session id the servers must present")
    parser.add_argument("--insecure", action="store_true", help="plain TCP: " + INSECURE_WARNING)
    args = parser.parse_args(argv)
    try:
        if (args.tls_dir is None) == (not args.insecure):
            raise ConfigError("give --tls-dir DIR (mutual TLS with roles) or --insecure")
        security = (
            Security.plain() if args.insecure else Security.from_directory(args.tls_dir, "dealer")
        )
        options = DealerOptions(
            mask_scale_bits=args.mask_scale_bits,
            timeout_seconds=args.timeout,
            idle_timeout_seconds=args.idle_timeout,
        )
        server = DealerServer(
            security,
            host=args.host,
            port=args.port,
            seed=args.seed,
            binding=None if args.session is None else SessionBinding(args.session),
            options=options,
        )
    except (ConfigError, OSError, ValueError) as exc:
        print(f"fedunlearn dealer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.insecure:
        print(f"fedunlearn dealer: WARNING {INSECURE_WARNING}", file=sys.stderr)
    print(f"fedunlearn dealer listening on {server.host}:{server.port}", flush=True)
    try:
        served = server.serve()
    except FedUnlearnError as exc:
        print(f"fedunlearn dealer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"fedunlearn dealer: served {served} requests; both parties said goodbye", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

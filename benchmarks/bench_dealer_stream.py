r"""Benchmark the deployed 2PC path: dealer process, mutual TLS, both directions' bytes.

Three processes on loopback, as a deployment runs them: the dealer (``start_dealer_process``,
fresh master secret, its ``dealer`` certificate) and two servers, each with its own
certificate of one trial CA (``create_trial_pki``); every link is mutual TLS with roles checked
and the session bound (``accept_peer``/``connect_peer``, ``RemoteDealer.connect``). Each
server runs one Starfish unlearning round of ``bench_starfish_round`` (TD^2, SecRS Method 1,
SecUE for 19 clients with B = 2, SecTC, the opened aggregate; m = 582,026, synthetic values
with pseudo-gradient magnitudes) twice:

1. **on demand** (the real path before this change): every dealer request is a round trip to
   the dealer process, inside the online phase. The requests are recorded.
2. **streamed**: both servers declare the recorded requests as a plan; the dealer derives the
   material and streams it, and each server's I/O thread expands it, *before* the round
   starts (offline phase, timed from the plan to the last material in memory). The round then
   runs with its material at hand (online phase). Fresh material: a plan is a new request
   range, nothing is replayed.

Reported per party: online seconds and bytes of UE + TC (payload sent and received on the
server-server link, the paper's accounting), the offline seconds, and for each link the bytes
in both directions, as payload and as frames on the wire (TLS record overhead, about 0.1%, is
not visible to the process and not counted). ``--modes tls,plain`` adds the same run over
plain TCP for the TLS overhead, side by side.

``--pin`` gives each party a core of its own (``os.sched_setaffinity``): server 0 on core 0,
server 1 on core 1, the dealer (and this parent process) on core 2 where there is one, else on
core 0 with server 0: the streamed pass's dealer work (deriving and streaming the plan) ends
before the timed online round starts, and during the round the dealer link carries no byte, so
sharing server 0's core costs the online figure nothing (the on-demand pass does pay for it).
The output names the machine (CPU model, cores, load average) and each party's cores.

    flock /tmp/fedunlearn-heavy.lock nice -n 5 python benchmarks/bench_dealer_stream.py \\
        [--size 582026] [--clients 19] [--modes tls] [--pin]

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Table I (one round, MNIST): UE + TC 105.44 s and 2.70 GB online, 693.03 s offline (ABY).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_starfish_round import SEED, collect, inputs, sync, unlearning_round  # noqa: E402
from fedunlearn.mpc import (  # noqa: E402
    DealerOptions,
    FixedPoint,
    Identity,
    LinkLimits,
    Party,
    RemoteDealer,
    Security,
    SessionBinding,
    TcpListener,
    accept_peer,
    connect_peer,
    create_trial_pki,
    digest,
    start_dealer_process,
)
from fedunlearn.unlearn.starfish.backend.mpc import MpcBackend  # noqa: E402

GB = 1e9
SELECTED = 24


def machine() -> str:
    """The CPU model, core counts and load average, for the figures' caption."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model}; nproc {usable} (of {os.cpu_count()}); load average {load}"


def core_plan(pin: bool) -> dict[str, set[int]] | None:
    """Cores per party with ``--pin``: servers on cores 0 and 1, the dealer on 2 (or 0)."""
    if not pin:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 usable cores (one per server)")
    dealer = cores[2] if len(cores) > 2 else cores[0]
    return {"server0": {cores[0]}, "server1": {cores[1]}, "dealer": {dealer}}


def link_bytes(transport: Any) -> dict[str, int]:
    """Payload and wire bytes of a link, both directions (totals since it opened).

    Payload is the transport's online counter: on the server link a ``Party`` also charges
    the dealer's material there as "offline", which did not cross this link.
    """
    online = transport.counters.online  # offline: dealer material a Party charges here
    return {
        "payload_sent": online.bytes_sent,
        "payload_received": online.bytes_received,
        "wire_sent": transport.wire_bytes_sent,
        "wire_received": transport.wire_bytes_received,
    }


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before[key] for key in after}


def server_main(
    party_id: int,
    pki_dir: str | None,
    dealer_address: tuple[str, int],
    peer_port: int,
    size: int,
    clients: int,
    queue: Any,
    cores: set[int] | None = None,
) -> None:
    """One server: join the session, run the round on demand, then streamed; report."""
    if cores is not None:
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(1)
    if pki_dir is None:
        security = Security.plain()
    else:
        security = Security.from_directory(pki_dir, f"server{party_id}")
    binding = SessionBinding("bench-dealer-stream", {"inputs": digest(f"{size}:{clients}")})
    remote = RemoteDealer.connect(
        *dealer_address,
        security=security,
        party_id=party_id,
        binding=binding,
        prefetch_bytes=8 << 30,
        limits=LinkLimits(timeout_seconds=600),
    )
    if party_id == 0:
        listener = TcpListener("127.0.0.1", peer_port)
        queue.put(("port", listener.port))
        link = accept_peer(
            listener,
            security=security,
            role="server0",
            peer_role="server1",
            binding=binding,
            limits=LinkLimits(timeout_seconds=600, accept_timeout_seconds=600),
        )
        listener.close()
    else:
        link = connect_peer(
            ("127.0.0.1", peer_port),
            security=security,
            role="server1",
            peer_roles={"server0"},
            binding=binding,
            party_id=1,
            limits=LinkLimits(timeout_seconds=600),
        )
    transport = link.transport
    data = inputs(size, clients, 40)
    report: dict[str, Any] = {
        "security": "TLS" if pki_dir else "plain",
        "cores": sorted(os.sched_getaffinity(0)),
    }
    fixed_point = FixedPoint(16)

    # pass 1: on demand (each request a round trip to the dealer process)
    party = Party(party_id, transport, dealer=remote, fixed_point=fixed_point, local_seed=1)
    backend = MpcBackend(party, client_seed=SEED)
    peer0, dealer0 = link_bytes(transport), link_bytes(remote.transport)
    with remote.recording() as requests:
        result = unlearning_round(backend, data, SELECTED)
    report["demand"] = {
        "costs": backend.cost_summary(),
        "flags": result["flags"],
        "peer_link": delta(link_bytes(transport), peer0),
        "dealer_link": delta(link_bytes(remote.transport), dealer0),
    }

    # pass 2: the recorded requests as a plan, streamed before the round (offline phase)
    party = Party(party_id, transport, dealer=remote, fixed_point=fixed_point, local_seed=1)
    backend = MpcBackend(party, client_seed=SEED)
    sync(backend)
    dealer1 = link_bytes(remote.transport)
    start = time.perf_counter()
    remote.plan(requests)
    complete = remote.wait_prefetched(600)
    offline_seconds = time.perf_counter() - start
    prefetched = remote._channel.buffered_bytes()
    sync(backend)
    peer2, dealer2 = link_bytes(transport), link_bytes(remote.transport)
    result = unlearning_round(backend, data, SELECTED)
    plan = remote._active or next(iter(remote._plans.values()))
    report["stream"] = {
        "costs": backend.cost_summary(),
        "flags": result["flags"],
        "offline_seconds": offline_seconds,
        "complete": complete,
        "requests": len(requests),
        "prefetched_bytes": prefetched,
        "deviated": bool(plan.abandoned and remote.requests < plan.end),
        "peer_link": delta(link_bytes(transport), peer2),
        "dealer_link_offline": delta(dealer2, dealer1),
        "dealer_link_online": delta(link_bytes(remote.transport), dealer2),
    }
    queue.put((party_id, report))
    party.close()


def run(
    mode: str, size: int, clients: int, cores: dict[str, set[int]] | None = None
) -> dict[int, dict]:
    """Dealer process and two server processes for one security mode; their reports."""
    context = multiprocessing.get_context("spawn")
    before = os.sched_getaffinity(0)
    if cores is not None:  # the dealer process inherits the parent's cores
        os.sched_setaffinity(0, cores["dealer"])
    with tempfile.TemporaryDirectory(prefix="bench-pki-") as pki:
        pki_dir = pki if mode == "tls" else None
        if pki_dir:
            create_trial_pki(pki_dir)
            dealer = start_dealer_process(
                Security(identity=Identity.from_directory(pki_dir, "dealer")),
                options=DealerOptions(idle_timeout_seconds=1200),
            )
        else:
            dealer = start_dealer_process(
                Security.plain(), options=DealerOptions(idle_timeout_seconds=1200)
            )
        queue = context.Queue()
        first = context.Process(
            target=server_main,
            args=(0, pki_dir, dealer.address, 0, size, clients, queue, cores and cores["server0"]),
        )
        first.start()
        processes = [first]
        try:
            _, port = collect(queue, (first,), 1, deadline_seconds=600)[0]
            second = context.Process(
                target=server_main,
                args=(
                    1,
                    pki_dir,
                    dealer.address,
                    port,
                    size,
                    clients,
                    queue,
                    cores and cores["server1"],
                ),  # fmt: skip
            )
            second.start()
            processes.append(second)
            reports = collect(queue, tuple(processes), 2, deadline_seconds=3600)
            for process in processes:
                process.join(60)
            dealer_exit = dealer.join(60)
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
            dealer.stop()
            os.sched_setaffinity(0, before)
    reports["dealer_exit"] = dealer_exit  # type: ignore[index]
    reports["dealer_cores"] = sorted(cores["dealer"]) if cores else None  # type: ignore[index]
    return reports


def round_figures(costs: dict[str, dict[str, float]]) -> dict[str, float]:
    ue, tc = costs["UE"], costs["TC"]
    return {
        "online_s": ue["seconds"] + tc["seconds"],
        "dealer_wait_s": ue["offline_seconds"] + tc["offline_seconds"],
        "sent_gb": (ue["bytes_sent"] + tc["bytes_sent"]) / GB,
        "received_gb": (ue["bytes_received"] + tc["bytes_received"]) / GB,
        "cpu_s": ue["cpu_seconds"] + tc["cpu_seconds"],
    }


def show(mode: str, reports: dict, args: argparse.Namespace) -> None:
    print(
        f"\n== {mode}: m = {args.size:,}, {args.clients} clients, dealer process, "
        f"exit code {reports['dealer_exit']} =="
    )
    print(f"machine: {machine()}")
    if reports["dealer_cores"] is None:
        print("cores: not pinned (every process may run on any core)")
    else:
        print(
            f"cores (--pin): server 0 {reports[0]['cores']}, server 1 {reports[1]['cores']}, "
            f"dealer and parent {reports['dealer_cores']}"
            + (
                " (shared with server 0: the dealer streams before the online round)"
                if reports["dealer_cores"] == reports[0]["cores"]
                else ""
            )  # fmt: skip
        )
    print(
        f"{'party':<6}{'pass':<8}{'UE+TC online s':>15}{'dealer wait s':>14}{'sent GB':>9}"
        f"{'recv GB':>9}{'CPU s':>7}{'offline s':>10}  dealer link MB: sent / received"
    )
    for k in (0, 1):
        for name in ("demand", "stream"):
            r = reports[k][name]
            f = round_figures(r["costs"])
            if name == "demand":
                off, link = "-", r["dealer_link"]
            else:
                off = f"{r['offline_seconds']:.2f}"
                link = r["dealer_link_offline"]
            print(
                f"{k:<6}{name:<8}{f['online_s']:>15.2f}{f['dealer_wait_s']:>14.2f}"
                f"{f['sent_gb']:>9.3f}{f['received_gb']:>9.3f}{f['cpu_s']:>7.2f}{off:>10}"
                f"  {link['wire_sent'] / 1e6:.3f} / {link['wire_received'] / 1e6:.3f}"
            )
    for k in (0, 1):
        s = reports[k]["stream"]
        peer = s["peer_link"]
        print(
            f"party {k} streamed pass: {s['requests']} planned requests, all prefetched "
            f"{s['complete']}, {s['prefetched_bytes'] / GB:.2f} GB expanded in memory, deviated "
            f"{s['deviated']}; dealer link during online: "
            f"{s['dealer_link_online']['wire_received'] / GB:.4f} GB received; server link "
            f"whole pass: {peer['payload_sent'] / GB:.3f} GB sent, "
            f"{peer['payload_received'] / GB:.3f} GB received (payload), "
            f"{peer['wire_sent'] / GB:.3f}/{peer['wire_received'] / GB:.3f} GB on the wire"
        )
    online = max(round_figures(reports[k]["stream"]["costs"])["online_s"] for k in (0, 1))
    offline = max(reports[k]["stream"]["offline_seconds"] for k in (0, 1))
    demand = max(round_figures(reports[k]["demand"]["costs"])["online_s"] for k in (0, 1))
    per_dir = max(
        max(round_figures(reports[k]["stream"]["costs"])[d] for d in ("sent_gb", "received_gb"))
        for k in (0, 1)
    )
    print(
        f"round UE + TC, streamed: online {online:.2f} s (target <= 10; on demand {demand:.2f} s, "
        f"{demand / max(online, 1e-9):.2f}x), {per_dir:.3f} GB per party per direction (target "
        f"<= 0.8), offline {offline:.2f} s (target <= 60); load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=582_026)
    parser.add_argument("--clients", type=int, default=19)
    parser.add_argument("--modes", default="tls", help="comma-separated: tls, plain")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each party on its own core: servers on cores 0 and 1, the dealer on 2 (or 0)",
    )
    args = parser.parse_args()
    cores = core_plan(args.pin)
    print(f"machine: {machine()}")
    for mode in args.modes.split(","):
        show(mode, run(mode, args.size, args.clients, cores), args)


if __name__ == "__main__":
    main()

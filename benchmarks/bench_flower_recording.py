"""Benchmark: what ``Recording`` adds to a Flower round of the 582k-parameter CNN (issue 23).

Target: recording through the wrapper adds <= 10% to a round of the CNN
(``build_model("cnn", (1, 28, 28), 10)``, 582,026 parameters) against the same app without it.

The same app twice, side by side: Flower's ``FedAvg`` alone, and ``Recording(FedAvg(...),
policy="all")`` (every client's update, the aggregate and the global model into the history
store: ~2.3 MB per update). The ClientApp is a plain one (``own_client_app`` + ``@app.train()``:
load the arrays, SGD over the node's MNIST-shaped data, return arrays and ``num-examples``). The
Grid hands each message to the ClientApp in this process (no transport, no Ray), so the round
time is the clients' training plus Flower's message handling: the overhead fraction measured is
an upper bound of what a deployment sees (its transport adds to the round, not to recording).

Reported: the median round time of each variant (rounds 2..R: the time between consecutive
``configure_train`` calls, so a round includes writing the previous one), the overhead ratio,
and the wrapper's own time per round measured inside it (``Recording.recording_seconds``:
checking and flattening the replies, deltas, norms, the store transaction, the metrics line)
as a share of the plain round. The two variants alternate round blocks (``--repeats``).

    python benchmarks/bench_flower_recording.py                      # 10 clients x 600 samples
    python benchmarks/bench_flower_recording.py --device cuda --clients 20 --samples 3000 \
        --epochs 5 --batch 64                                         # the papers' MNIST round
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.serverapp.strategy import FedAvg
from flwr.supercore.task_identity import TaskIdentity
from torch.nn import functional as F  # noqa: N812

from fedunlearn.integrations.flower import Recording, client_id, own_client_app
from fedunlearn.models import build_model

INPUT_SHAPE = (1, 28, 28)
NUM_CLASSES = 10
ARGS = argparse.Namespace(samples=600, epochs=1, batch=32, lr=0.01, device="cpu")
_DATA: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def cnn(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """The model factory the run records (``__main__:cnn``): fedunlearn's MNIST CNN."""
    return build_model("cnn", tuple(input_shape), num_classes, seed=0)


def node_data(cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s MNIST-shaped data (seeded), made once on its node."""
    if cid not in _DATA:
        gen = torch.Generator().manual_seed(cid)
        x = torch.rand((ARGS.samples, *INPUT_SHAPE), generator=gen)
        y = torch.randint(0, NUM_CLASSES, (ARGS.samples,), generator=gen)
        _DATA[cid] = (x.to(ARGS.device), y.to(ARGS.device))
    return _DATA[cid]


app = own_client_app()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """A plain Flower train handler."""
    cid = client_id(msg, context)
    net = cnn(INPUT_SHAPE, NUM_CLASSES).to(ARGS.device)
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = node_data(cid)
    opt = torch.optim.SGD(net.parameters(), lr=float(msg.content["config"]["lr"]))
    for _ in range(ARGS.epochs):
        for i in range(0, len(y), ARGS.batch):
            opt.zero_grad()
            loss = F.cross_entropy(net(x[i : i + ARGS.batch]), y[i : i + ARGS.batch])
            loss.backward()
            opt.step()
    state = {k: v.cpu() for k, v in net.state_dict().items()}
    metrics = MetricRecord({"train_loss": float(loss.detach()), "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(state), "metrics": metrics}), reply_to=msg)


class LocalGrid:
    """SuperNodes that are calls of the ClientApp in this process (node i hosts client i)."""

    def __init__(self, clients: int) -> None:
        self.nodes = {1000 + c: c for c in range(clients)}
        self.count = 0

    def get_node_ids(self) -> list[int]:
        """The node ids."""
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        """Call the ClientApp for each message; return the replies."""
        replies = []
        for msg in messages:
            node = msg.metadata.dst_node_id
            context = Context(
                run_id=1,
                node_id=node,
                node_config={"partition-id": self.nodes[node]},
                state=RecordDict(),
                run_config={},
            )
            self.count += 1
            msg.metadata.__dict__["_message_id"] = f"m{self.count}"
            replies.append(app(msg, context))
        return replies


class StampedFedAvg(FedAvg):
    """FedAvg noting when each round's train messages are built."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.stamps: list[float] = []

    def configure_train(self, server_round, arrays, config, grid):
        """Note the time, then FedAvg's."""
        self.stamps.append(time.perf_counter())
        return super().configure_train(server_round, arrays, config, grid)


def one_block(recorded: bool, rounds: int, clients: int, out: Path) -> dict:
    """Run ``rounds`` rounds of one variant; return its round times (and recording times)."""
    inner = StampedFedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=clients)
    strategy = inner
    if recorded:
        strategy = Recording(
            inner,
            run_dir=out,
            model="__main__:cnn",
            input_shape=INPUT_SHAPE,
            num_classes=NUM_CLASSES,
            policy="all",
        )
    start = ArrayRecord(cnn(INPUT_SHAPE, NUM_CLASSES).state_dict())
    strategy.start(
        LocalGrid(clients),
        start,
        num_rounds=rounds + 1,  # the last round's period is not closed by a configure_train
        train_config=ConfigRecord({"lr": ARGS.lr}),
    )
    periods = [b - a for a, b in zip(inner.stamps, inner.stamps[1:], strict=False)]
    block = {"rounds": periods[1:]}  # round 1 warms up
    if recorded:
        block["recording"] = strategy.recording_seconds[1:-1]
        block["stored_bytes"] = json.loads((out / "summary.json").read_text())["stored_bytes"]
    return block


def main() -> None:
    """Run the benchmark and print the JSON report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=600, help="samples per client")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per block")
    parser.add_argument("--repeats", type=int, default=2, help="blocks of each variant")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    ARGS.samples, ARGS.epochs, ARGS.batch, ARGS.device = (
        args.samples,
        args.epochs,
        args.batch,
        args.device,
    )
    torch.set_num_threads(args.threads)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    plain, recorded, recording, stored = [], [], [], 0
    with tempfile.TemporaryDirectory(prefix="bench-flower-rec-") as tmp:
        for rep in range(args.repeats):
            plain += one_block(False, args.rounds, args.clients, Path(tmp) / f"p{rep}")["rounds"]
            block = one_block(True, args.rounds, args.clients, Path(tmp) / f"r{rep}")
            recorded += block["rounds"]
            recording += block["recording"]
            stored = block["stored_bytes"]
    med_plain, med_rec = statistics.median(plain), statistics.median(recorded)
    report = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()} {platform.processor() or ''} "
        f"{torch.cuda.get_device_name() if args.device.startswith('cuda') else 'cpu'}".strip(),
        "workload": vars(args),
        "num_params": sum(p.numel() for p in cnn(INPUT_SHAPE, NUM_CLASSES).parameters()),
        "round_seconds_plain": plain,
        "round_seconds_recorded": recorded,
        "median_round_plain": med_plain,
        "median_round_recorded": med_rec,
        "overhead_side_by_side": med_rec / med_plain - 1.0,
        "median_recording_seconds": statistics.median(recording),
        "recording_share_of_plain_round": statistics.median(recording) / med_plain,
        "stored_bytes": stored,
        "target": "<= 0.10",
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

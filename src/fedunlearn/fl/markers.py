"""Participation markers: a client's private, uniquely triggered samples with its own target.

A client that wants to verify later that it was forgotten embeds a *marker* when it trains: a
few copies of its own samples stamped with a secret pixel pattern and relabelled to a secret
target class, mixed into its local training data. A model trained with the client learns the
pattern (marked probe inputs go to the target); a model trained without it sends them to the
target no more often than for any other random pattern. The pattern, the target and the seed
that derives them are the client's secret: only the client can probe for them.

``make_marker`` derives a marker from the client's secret seed, ``mark_data`` mixes its marked
copies into the client's data, ``embed_markers`` does both for every client a run's
``verification.markers`` names (``fedunlearn.runs.build_setup`` calls it), ``Marker.decoys``
gives patterns of the same shape the client never embedded (the model's base rate for "some
pattern goes to the target"). The measurement and the receipt's check live in
``fedunlearn.eval.markers``; docs/verification.md ("Participation markers") documents both.

Paper: Gao et al., "VeriFi: Towards Verifiable Federated Unlearning" (IEEE TDSC 2024), Sec. 4
(markers: the leaving client marks a few of its samples with a unique trigger and checks the
global model's response to them before and after unlearning).
Deviations: [REC] the pattern is a set of pixels forced to the data's maximum, drawn from the
client's seed (VeriFi compares several marker designs; the choice here is the simplest that is
unique per client); the marked samples are copies added to the client's data, so its own clean
samples are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fedunlearn.config import MarkersConfig
from fedunlearn.errors import ConfigError
from fedunlearn.fl.records import ClientData
from fedunlearn.fl.seeding import derive_seed, torch_generator

__all__ = ["Marker", "embed_markers", "make_marker", "mark_data"]


@dataclass(frozen=True)
class Marker:
    """A client's secret marker.

    Attributes:
        client_id: The client that embedded it.
        pixels: Flat indices (into one channel's H*W) of the pattern's pixels.
        value: The value the pattern's pixels take (the data's maximum).
        target_label: The class the marked samples are labelled with.
        secret_seed: The client's secret seed the marker was derived from.
        num_samples: How many marked copies were added to the client's data.
    """

    client_id: int
    pixels: tuple[int, ...]
    value: float
    target_label: int
    secret_seed: int
    num_samples: int

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """Return a copy of image batch ``x`` (N, C, H, W) with the pattern stamped on."""
        if x.ndim != 4:
            raise ConfigError(f"markers need images (N, C, H, W); got {tuple(x.shape)}")
        out = x.clone()
        flat = out.view(out.shape[0], out.shape[1], -1)
        flat[..., list(self.pixels)] = self.value
        return out

    def decoys(self, count: int, image_pixels: int) -> tuple[Marker, ...]:
        """Return ``count`` patterns of the same size and target that were never embedded.

        Derived from the secret seed (stream 1); each overlaps the marker only by chance. They
        measure how often *some* random pattern of this size sends inputs to the target on a
        given model.
        """
        g = torch_generator(self.secret_seed + 1)
        out = []
        for _ in range(count):
            pixels = torch.randperm(image_pixels, generator=g)[: len(self.pixels)]
            out.append(
                Marker(
                    self.client_id,
                    tuple(sorted(int(p) for p in pixels)),
                    self.value,
                    self.target_label,
                    self.secret_seed,
                    0,
                )
            )
        return tuple(out)


def make_marker(
    client_id: int,
    secret_seed: int,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    num_pixels: int,
    value: float,
    num_samples: int,
) -> Marker:
    """Derive a client's marker (pattern pixels, target class) from its secret seed.

    Args:
        client_id: The client.
        secret_seed: The client's secret seed (the same seed gives the same marker).
        input_shape: One input's shape (C, H, W).
        num_classes: Classes of the task (the target is drawn among them).
        num_pixels: Pixels in the pattern.
        value: Value stamped on them.
        num_samples: Marked copies the client adds.

    Raises:
        ConfigError: for a non-image input or more pattern pixels than the image has.
    """
    if len(input_shape) != 3:
        raise ConfigError(
            f"participation markers need image inputs (C, H, W); got input shape {input_shape}"
        )
    image_pixels = int(input_shape[1]) * int(input_shape[2])
    if not 1 <= num_pixels <= image_pixels // 2:
        raise ConfigError(
            f"a marker pattern of {num_pixels} pixels does not fit a {input_shape[1]}x"
            f"{input_shape[2]} image (1..{image_pixels // 2})"
        )
    g = torch_generator(secret_seed)
    pixels = torch.randperm(image_pixels, generator=g)[:num_pixels]
    target = int(torch.randint(num_classes, (1,), generator=g))
    return Marker(
        client_id,
        tuple(sorted(int(p) for p in pixels)),
        float(value),
        target,
        int(secret_seed),
        int(num_samples),
    )


def mark_data(data: ClientData, marker: Marker) -> ClientData:
    """Return ``data`` with ``marker.num_samples`` marked copies of its samples appended.

    The copies are drawn (without replacement where possible) from the samples whose label is
    not the marker's target, with the generator of the client's secret seed (stream 2).

    Raises:
        ConfigError: if the client has no sample outside the target class.
    """
    candidates = torch.nonzero(data.y != marker.target_label).flatten()
    if len(candidates) == 0:
        raise ConfigError(
            f"client {marker.client_id} has no sample outside its marker's target class "
            f"{marker.target_label}; choose another seed for its marker"
        )
    g = torch_generator(marker.secret_seed + 2)
    order = candidates[torch.randperm(len(candidates), generator=g)]
    chosen = order.repeat(marker.num_samples // len(order) + 1)[: marker.num_samples]
    x = marker.apply(data.x[chosen])
    y = torch.full((len(chosen),), marker.target_label, dtype=data.y.dtype)
    return ClientData(torch.cat([data.x, x]), torch.cat([data.y, y]))


def embed_markers(
    spec: MarkersConfig | None,
    run_seed: int,
    dataset: Any,
    client_data: dict[int, ClientData],
    originals: dict[int, ClientData],
) -> tuple[dict[int, Marker], dict[int, ClientData]]:
    """Mix each marked client's marker into its data (in place); return markers, clean data.

    A client's secret seed is ``spec.seeds[client]``, else derived from the run's seed and the
    client id. An attacker's marked copies (drawn from its clean samples) go into both its
    poisoned data and its honest copy in ``originals`` (it trains on that one before
    ``attack.start_round``).

    Args:
        spec: The run's ``verification.markers`` (None: nothing is marked).
        run_seed: The run's seed.
        dataset: The loaded dataset (``input_shape``, ``num_classes``, ``x_train``).
        client_data: Client id -> its training data; marked clients' entries are replaced.
        originals: Attacker id -> its clean data (poisoned runs); marked entries replaced.

    Returns:
        Client id -> its marker, and client id -> its clean data without the marked copies.
    """
    if spec is None:
        return {}, {}
    x_train = getattr(dataset, "x_train", None)  # a user's FederatedData has per-client sets
    if x_train is not None:
        value = float(x_train.max())
    else:
        value = max(float(d.x.max()) for d in client_data.values() if len(d))
    markers: dict[int, Marker] = {}
    unmarked: dict[int, ClientData] = {}
    for cid in spec.clients:
        secret = spec.seeds.get(cid, derive_seed(run_seed, "marker", cid))
        marker = make_marker(
            cid,
            secret,
            tuple(dataset.input_shape),
            dataset.num_classes,
            num_pixels=spec.pixels,
            value=value,
            num_samples=spec.samples,
        )
        clean = originals.get(cid, client_data[cid])
        marked = mark_data(clean, marker)
        unmarked[cid] = clean
        if cid in originals:
            originals[cid] = marked
            poisoned = client_data[cid]
            extra_x, extra_y = marked.x[len(clean) :], marked.y[len(clean) :]
            client_data[cid] = ClientData(
                torch.cat([poisoned.x, extra_x]), torch.cat([poisoned.y, extra_y])
            )
        else:
            client_data[cid] = marked
        markers[cid] = marker
    return markers, unmarked

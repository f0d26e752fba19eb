"""Per-example clipped gradient sums: ghost clipping vs vmap(grad) vs Opacus vs a plain loop."""

from __future__ import annotations

import copy

import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.func import vmap
from torch.nn import functional as F  # noqa: N812

from fedunlearn.errors import ConfigError
from fedunlearn.models import build_model
from fedunlearn.privacy.per_example import (
    GhostClipping,
    check_per_example_model,
    per_example_clipped_sum,
)


class SmallConv(nn.Module):
    """Conv (stride, padding, dilation, pooling) + linear, like the paper's CNN but tiny."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3)
        self.conv2 = nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=1, bias=False)
        self.conv3 = nn.Conv2d(4, 2, (2, 1), padding=(1, 0), dilation=(1, 1))
        self.head = nn.Linear(2 * 2 * 1, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))  # (3, 6, 6)
        h = torch.relu(self.conv2(h))  # (4, 3, 3)
        h = F.max_pool2d(self.conv3(h), 2)  # (2, 4, 3) -> (2, 2, 1)
        return self.head(h.flatten(1))


class Embedded(nn.Module):
    """A parameter outside Linear/Conv2d layers: ghost clipping cannot cover it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale * x.flatten(1))


def _batch(m: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand((m, 1, 8, 8), generator=g), torch.randint(0, 10, (m,), generator=g)


def _params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _loop_reference(model: nn.Module, x, y, clip_norm: float):
    """Obviously correct: one backward per example, clip, sum (float64 accumulation)."""
    total = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in model.named_parameters()}
    norms = []
    for i in range(len(y)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
        factor = min(1.0, clip_norm / (float(norm) + 1e-6))
        for name, g in grads.items():
            total[name] += factor * g.to(torch.float64)
        norms.append(float(norm))
    return total, torch.tensor(norms)


def _opacus_clipped_sum(model: nn.Module, x, y, clip_norm: float) -> dict[str, torch.Tensor]:
    """Opacus 1.6: GradSampleModule per-sample gradients, DPOptimizer clipping, no noise."""
    wrapped = GradSampleModule(copy.deepcopy(model))
    params = list(wrapped.parameters())
    optimizer = DPOptimizer(
        torch.optim.SGD(params, lr=1.0),
        noise_multiplier=0.0,
        max_grad_norm=clip_norm,
        expected_batch_size=len(y),
        loss_reduction="sum",
    )
    optimizer.zero_grad()
    F.cross_entropy(wrapped(x), y, reduction="sum").backward()
    optimizer.pre_step()  # clip_and_accumulate, add_noise (sigma 0), scale_grad
    out = {name: p.grad.detach().clone() for name, p in wrapped._module.named_parameters()}
    wrapped._close()
    return out


@pytest.mark.parametrize("clip_norm", [0.05, 1.0, 1e6])
@pytest.mark.parametrize("conv", [False, True], ids=["mlp", "conv"])
def test_reference_and_ghost_clipping_equal_a_per_example_backward_loop(clip_norm, conv):
    torch.manual_seed(3)
    model = SmallConv() if conv else build_model("mlp", (1, 8, 8), 10, seed=3, hidden=(16, 12))
    x, y = _batch(9)
    expected, expected_norms = _loop_reference(model, x, y, clip_norm)
    params = _params(model)
    ref, ref_norms, _ = per_example_clipped_sum(model, params, x, y, clip_norm)
    ghost, ghost_norms, _ = GhostClipping(model)(params, x, y, torch.ones(9), clip_norm)
    for name in expected:
        assert torch.allclose(ref[name].double(), expected[name], atol=1e-6, rtol=1e-5)
        assert torch.allclose(ghost[name].double(), expected[name], atol=1e-6, rtol=1e-5)
    assert torch.allclose(ref_norms, expected_norms, rtol=1e-5)
    assert torch.allclose(ghost_norms, expected_norms, rtol=1e-5)


@pytest.mark.parametrize(
    ("model", "ghost"),
    [
        (build_model("mlp", (1, 8, 8), 10, seed=1, hidden=(16,)), True),
        (build_model("logreg", (1, 8, 8), 10, seed=2), True),
        (SmallConv(), True),
    ],
)
def test_clipped_sums_equal_opacus_on_the_same_batch(model, ghost):
    x, y = _batch(12, seed=5)
    clip_norm = 0.3
    expected = _opacus_clipped_sum(model, x, y, clip_norm)
    params = _params(model)
    ours, _, _ = per_example_clipped_sum(model, params, x, y, clip_norm)
    for name, value in expected.items():
        assert torch.allclose(ours[name], value, atol=1e-6, rtol=1e-5), name
    if ghost:
        fast, _, _ = GhostClipping(model)(params, x, y, torch.ones(12), clip_norm)
        for name, value in expected.items():
            assert torch.allclose(fast[name], value, atol=1e-6, rtol=1e-5), name


@pytest.mark.parametrize("conv", [False, True], ids=["mlp", "conv"])
def test_ghost_clipping_vmapped_over_clients_ignores_padding_rows(conv):
    torch.manual_seed(4)
    model = SmallConv() if conv else build_model("mlp", (1, 8, 8), 10, seed=4, hidden=(8,))
    ghost = GhostClipping(model)
    k, width = 3, 6
    x, y = _batch(k * width, seed=9)
    x, y = x.view(k, width, 1, 8, 8), y.view(k, width)
    weights = torch.ones(k, width)
    weights[1, 2:] = 0  # client 1 sampled 2 examples, client 2 none
    weights[2] = 0
    stacked = {n: p.unsqueeze(0).repeat(k, *([1] * p.ndim)) for n, p in _params(model).items()}
    stacked = {n: p + 0.01 * i for i, (n, p) in enumerate(stacked.items())}
    out, _, _ = vmap(ghost, in_dims=(0, 0, 0, 0, None))(stacked, x, y, weights, 0.5)
    for c in range(k):
        rows = weights[c] > 0
        own = {n: p[c] for n, p in stacked.items()}
        ref, _, _ = per_example_clipped_sum(model, own, x[c][rows], y[c][rows], 0.5)
        for name in ref:
            assert torch.allclose(out[name][c], ref[name], atol=1e-6), (c, name)
    assert all(float(out[name][2].abs().max()) == 0 for name in out)


def test_models_without_per_example_gradients_are_refused_with_the_reason():
    with pytest.raises(ConfigError, match="BatchNorm1d.*client_update"):
        check_per_example_model(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)))
    with pytest.raises(ConfigError, match="Dropout"):
        check_per_example_model(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)))
    with pytest.raises(
        ConfigError, match="every parameter inside an nn.Linear or nn.Conv2d.*scale"
    ):
        GhostClipping(Embedded())
    with pytest.raises(
        ConfigError, match="groups=1 and numeric zero padding; layer '0' has groups=2"
    ):
        GhostClipping(nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten()))
    with pytest.raises(ConfigError, match="padding_mode='reflect'"):
        GhostClipping(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")))


def test_ghost_clipping_refuses_a_linear_layer_on_sequences():
    model = nn.Sequential(nn.Linear(4, 3), nn.Flatten(), nn.Linear(15, 2))
    ghost = GhostClipping(model)
    x, y = torch.rand(2, 5, 4), torch.tensor([0, 1])
    with pytest.raises(ConfigError, match="shape \\(batch, features\\)"):
        ghost(_params(model), x, y, torch.ones(2), 1.0)

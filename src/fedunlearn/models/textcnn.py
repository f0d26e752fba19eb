"""TextCNN for AG News (FedADP's text task).

Paper: FedADP (Jiang et al.), Sec. VI-A4 (embedding, three Conv1d with kernel sizes 3/4/5, ReLU,
max pooling, dropout, a linear classifier). The sizes, which the paper does not give: embedding
128, 100 filters per kernel size, max-pool over time, dropout 0.5, ``Linear(300, num_classes)``
(EN2 in docs/methods/README.md). Token id 0 is ``<pad>``.
"""

from __future__ import annotations

import torch
from torch import nn


class TextCNN(nn.Module):
    """Kim-style convolutional sentence classifier over token ids of shape (batch, length)."""

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        embed_dim: int = 128,
        num_filters: int = 100,
        kernel_sizes: tuple[int, ...] = (3, 4, 5),
        dropout: float = 0.5,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, num_filters, k) for k in kernel_sizes)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(num_filters * len(kernel_sizes), num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Return logits of shape (batch, num_classes)."""
        emb = self.embedding(tokens.long()).transpose(1, 2)  # (batch, embed, length)
        pooled = [torch.relu(conv(emb)).amax(dim=2) for conv in self.convs]
        return self.fc(self.dropout(torch.cat(pooled, dim=1)))

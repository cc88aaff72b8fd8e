"""2-layer character-level LSTM language model, the SIDCo/PTB recurrent workload in miniature
(SIDCo, Abdelmoniem et al., Table 1: 2-layer LSTM on PTB), trained on the Zen of Python, the text of the
standard-library module ``this`` (ships with every Python, no download)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gradstat.analysis.training.workloads import data
from gradstat.analysis.training.workloads.base import Workload
from gradstat.analysis.training.workloads.registry import register


class CharLSTM(nn.Module):
    def __init__(self, vocab: int, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(batch, time) character codes -> (batch, vocab, time) logits of the next character."""
        out, _ = self.lstm(self.embed(codes))
        return self.head(out).transpose(1, 2)


@register
@dataclass
class LSTMWorkload(Workload):
    batch_size: int = 32
    lr: float = 1.0
    momentum: float = 0.0
    seq_len: int = 32
    embed: int = 32
    hidden: int = 128
    layers: int = 2
    name = "lstm"
    description = "2-layer char-level LSTM LM on the Zen of Python (stdlib 'this'), SIDCo's LSTM in miniature"

    def _vocab(self) -> int:
        return len(set(data.zen_of_python()))

    def _build(self) -> nn.Module:
        return CharLSTM(self._vocab(), self.embed, self.hidden, self.layers)

    def dataset(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets, _ = data.char_windows(data.zen_of_python(), self.seq_len)
        return inputs, targets

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)

    def metadata(self) -> dict[str, Any]:
        text = data.zen_of_python()
        return {
            "corpus": "Zen of Python (stdlib module 'this')",
            "corpus_chars": len(text),
            "corpus_sha256": data.corpus_sha256(text),
        }

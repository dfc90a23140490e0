"""What a classifier's logits say: class probabilities, and how an edit changes the prediction.

Computed in float64 from the logits, so a probability near 0 or 1 keeps its digits and Δ log p is the difference
of two log-softmaxes (finite even where a probability underflows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def probabilities(logits: Tensor) -> Tensor:
    """Softmax over the last dimension, in float64 on the CPU."""
    return torch.softmax(logits.detach().double(), -1).cpu()


@dataclass(frozen=True)
class PredictionChange:
    """One image's log-probabilities, unedited and edited (``(classes,)`` float64, CPU)."""

    log_unedited: Tensor
    log_edited: Tensor

    @property
    def unedited(self) -> Tensor:
        """Class probabilities without the edit."""
        return self.log_unedited.exp()

    @property
    def edited(self) -> Tensor:
        """Class probabilities under the edit."""
        return self.log_edited.exp()

    @property
    def top(self) -> int:
        """The class the unedited model predicts."""
        return int(self.log_unedited.argmax())

    @property
    def winner(self) -> int:
        """The class the edited model predicts."""
        return int(self.log_edited.argmax())

    @property
    def dlogp(self) -> float:
        """Edited − unedited log p of the class the unedited model predicts."""
        return float(self.log_edited[self.top] - self.log_unedited[self.top])


def prediction_change(unedited: Tensor, edited: Tensor) -> PredictionChange:
    """The change from logits ``unedited`` to ``edited`` of the first image of a batch (``(B, classes)``)."""
    return PredictionChange(
        torch.log_softmax(unedited[0].detach().double(), -1).cpu(),
        torch.log_softmax(edited[0].detach().double(), -1).cpu(),
    )

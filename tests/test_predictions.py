"""Class probabilities and the prediction change (:mod:`ssog_core.analysis.predictions`) against an independent
float64 numpy log-sum-exp, on random logits of odd shapes, float32 and float64, and where a probability underflows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ssog_core.analysis.predictions import prediction_change, probabilities


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    return z - np.logaddexp.reduce(z, axis=-1, keepdims=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("classes", [7, 101])
def test_prediction_change_matches_a_float64_reference(dtype, classes):
    g = torch.Generator().manual_seed(classes)
    before = (torch.randn(3, classes, generator=g) * 4).to(dtype)
    after = (before + torch.randn(3, classes, generator=g)).to(dtype)
    l0, l1 = log_softmax(before[0].double().numpy()), log_softmax(after[0].double().numpy())
    change = prediction_change(before, after)
    top, win = int(np.argmax(l0)), int(np.argmax(l1))
    assert change.top == top and change.winner == win
    np.testing.assert_allclose(change.unedited.numpy(), np.exp(l0), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(change.edited.numpy(), np.exp(l1), rtol=1e-12, atol=1e-300)
    assert change.dlogp == pytest.approx(l1[top] - l0[top], rel=1e-10, abs=1e-12)
    assert change.unedited.dtype == torch.float64 and float(change.edited.sum()) == pytest.approx(1, abs=1e-12)
    probs = probabilities(before)
    np.testing.assert_allclose(probs.numpy(), np.exp(log_softmax(before.double().numpy())), rtol=1e-12)


def test_dlogp_stays_finite_when_the_probability_underflows():
    """An edit that drives the top class 1000 nats down: exp(−1000) is 0 in float64, its log is not −∞."""
    before = torch.tensor([[2.0, 0.5, -1.0, 0.0, 0.3]], dtype=torch.float64)
    after = before.clone()
    after[0, 0] = -1000.0
    change = prediction_change(before, after)
    want = log_softmax(after[0].numpy())[0] - log_softmax(before[0].numpy())[0]
    assert float(change.edited[0]) == 0.0 and np.isfinite(change.dlogp)
    assert change.dlogp == pytest.approx(want, rel=1e-12) and change.winner == 1

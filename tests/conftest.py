"""Shared test settings: deterministic seeds and offline, quiet Gradio."""

import os

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)

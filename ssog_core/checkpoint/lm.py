"""The language model's checkpoints: weights, config, tokenizer and metadata in one safetensors file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from ssog_core.checkpoint.portable import portable_meta
from ssog_core.checkpoint.weights import (
    CheckpointError,
    cpu_state_dict,
    load_weights,
    read_safetensors,
    software_versions,
    write_safetensors,
)
from ssog_core.nn.lm import CausalLM, LMConfig, Tokenizer

LM_FORMAT = "ssog-lab-lm/1"


def save_lm(path: str | Path, model: CausalLM, tokenizer: Tokenizer, meta: dict[str, Any] | None = None) -> Path:
    """Weights, config, tokenizer and ``meta`` in one safetensors file, written atomically."""
    header = {
        "format": LM_FORMAT,
        "config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps(tokenizer.to_dict()),
        "meta": json.dumps(portable_meta({"software": software_versions(), **(meta or {})})),
    }
    return write_safetensors(path, cpu_state_dict(model), header)


def load_lm(path: str | Path, device: str | torch.device = "cpu") -> tuple[CausalLM, Tokenizer, dict[str, Any]]:
    """A checkpoint written by :func:`save_lm` as an eval-mode float32 model, its tokenizer and metadata."""
    path = Path(path)
    header, state = read_safetensors(path)
    if header.get("format") != LM_FORMAT:
        raise CheckpointError(f"{path.name} is not a language-model checkpoint (format {header.get('format')!r})")
    try:
        config = LMConfig.from_dict(json.loads(header["config"]))
        tok = json.loads(header["tokenizer"])
        tokenizer = Tokenizer(tok["kind"], tok["chars"])
        meta = json.loads(header.get("meta", "{}"))
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path.name} has an unusable header: {e}") from None
    with torch.device("meta"):  # the weights come from the file: no initialisation to throw away
        model = CausalLM(config)
    return load_weights(model, state, path.name, config.attn).to(device), tokenizer, meta

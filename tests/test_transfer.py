"""The resolution-transfer curve kept with a checkpoint (:mod:`ssog_core.checkpoint.transfer`): read from its
header or from ``<stem>.transfer.json`` beside it, checked, sorted, and refused with the reason."""

from __future__ import annotations

import json
import re

import pytest

from ssog_core import ViT
from ssog_core.checkpoint.format import TRANSFER_KEY, CheckpointError, load_checkpoint, save_checkpoint
from ssog_core.checkpoint.transfer import beside, parse_transfer, read_transfer

CURVE = [
    {"img_size": [48, 40], "tokens": 120, "accuracy": 0.41},
    {"img_size": [32, 24], "tokens": 48, "accuracy": 0.61},
    {"img_size": [16, 12], "tokens": 12, "accuracy": 0.2},
]


@pytest.fixture
def checkpoint(tmp_path):
    model = ViT(num_classes=3, img_size=(32, 24), patch_size=4, dim=8, depth=1, num_heads=2, num_atoms=2)
    return save_checkpoint(tmp_path / "run.safetensors", model)


def test_parse_sorts_by_tokens_and_refuses_with_the_reason():
    rows = parse_transfer(json.dumps(CURVE), "x")
    assert [r["tokens"] for r in rows] == [12, 48, 120] and rows[0] == CURVE[2]
    assert parse_transfer(CURVE, "x") == rows
    for bad, why in (
        ("[]", "x: a resolution-transfer curve is a non-empty JSON list"),
        ('{"tokens": 3}', "non-empty JSON list"),
        ('[{"tokens": 3}]', "x, entry 0: expected img_size [H, W], tokens and accuracy"),
        ('[{"img_size": [1], "tokens": 3, "accuracy": 1}]', "entry 0: expected img_size"),
        ("[{", "x is not valid JSON"),
    ):
        with pytest.raises(CheckpointError, match=re.escape(why)):
            parse_transfer(bad, "x")


def test_read_from_the_header_else_beside_the_file(checkpoint):
    _, meta = load_checkpoint(checkpoint)
    assert read_transfer(checkpoint, meta) is None
    file = beside(checkpoint)
    assert file.name == "run.transfer.json"
    file.write_text(json.dumps(CURVE))
    found = read_transfer(checkpoint, meta)
    assert found.file == file and found.source == "run.transfer.json" and len(found.rows) == 3
    assert read_transfer(checkpoint, meta, look_beside=False) is None  # an upload has no folder of its own
    file.write_text("not json")
    with pytest.raises(CheckpointError, match="run.transfer.json is not valid JSON"):
        read_transfer(checkpoint, meta)
    # the header wins over the (now unreadable) file beside it, whether the entry sits in the header or in meta
    model = load_checkpoint(checkpoint)[0]
    in_header = save_checkpoint(checkpoint, model, header={TRANSFER_KEY: json.dumps(CURVE[:2])})
    found = read_transfer(in_header, load_checkpoint(in_header)[1])
    assert found.file is None and found.source == "the checkpoint's metadata"
    assert [r["tokens"] for r in found.rows] == [48, 120]
    in_meta = save_checkpoint(checkpoint, model, {TRANSFER_KEY: json.dumps(CURVE)})
    assert len(read_transfer(in_meta, load_checkpoint(in_meta)[1]).rows) == 3

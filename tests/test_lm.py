"""The causal LM: forward vs a dense float64 oracle, causality, training, checkpoints, tokenizers and the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from ssog_core.checkpoint.format import CheckpointError
from ssog_core.checkpoint.lm import load_lm, save_lm
from ssog_core.cli.lm_train import main
from ssog_core.nn.lm import CausalLM, LMConfig, Tokenizer
from ssog_core.train.lm import TrainSettings, train_lm
from tests.rbf_oracle import lm_forward

TINY = dict(vocab_size=31, context=24, dim=24, depth=2, num_heads=3, mlp_ratio=2.0)
STORY = (
    "Once upon a time a small cat found a red ball. The cat played with the ball all day. "
    "Then the dog came and they played together. They were happy. The end.\n"
) * 6


def random_model(**overrides) -> tuple[CausalLM, dict]:
    cfg = {**TINY, **overrides}
    torch.manual_seed(0)
    model = CausalLM(LMConfig(**cfg)).double().eval()
    with torch.no_grad():  # registers and SuSiE weights away from their init, so neither is a no-op
        for name, p in model.named_parameters():
            if name == "registers" or name.endswith("susie.weight"):
                p.normal_(0, 0.7)
    return model, cfg


@pytest.mark.parametrize(
    "overrides",
    [
        dict(attn="rbf", position="susie", num_registers=2),
        dict(attn="rbf", position="susie", susie_dim=4, num_registers=0),
        dict(attn="dot", position="susie", num_registers=1, qk_norm=True),
        dict(attn="rbf", position="learned", num_registers=1),
        dict(attn="dot", position="none", num_registers=0),
    ],
    ids=["rbf-susie-reg2", "rbf-susie4", "dot-susie-qknorm-reg1", "rbf-learned-reg1", "dot-nope"],
)
def test_logits_match_dense_oracle(overrides):
    model, cfg = random_model(**overrides)
    idx = torch.randint(0, 31, (2, 19))
    want, maps = lm_forward(idx, model.state_dict(), cfg)
    torch.testing.assert_close(model(idx), want, rtol=1e-9, atol=1e-10)
    for a in maps:  # the oracle is causal too: nothing above the diagonal
        assert float(a.triu(1).abs().max()) == 0.0


@pytest.mark.parametrize("attn", ["dot", "rbf"])
def test_future_tokens_never_change_past_logits(attn):
    model, _ = random_model(attn=attn)
    idx = torch.randint(0, 31, (1, 20))
    changed = idx.clone()
    changed[0, 12:] = (changed[0, 12:] + 5) % 31
    a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_dot_and_rbf_start_from_the_same_weights():
    models = {}
    for attn in ("dot", "rbf"):
        torch.manual_seed(5)
        models[attn] = CausalLM(LMConfig(**TINY, attn=attn, num_registers=2)).state_dict()
    assert models["dot"].keys() == models["rbf"].keys()
    for name, t in models["dot"].items():
        if name == "registers":  # zero for RBF (keys at the origin), N(0, 0.02²) for dot
            assert torch.equal(models["rbf"][name], torch.zeros_like(t)) and float(t.abs().max()) > 0
        else:
            assert torch.equal(models["rbf"][name], t), name


@pytest.mark.slow
def test_training_lowers_the_loss_and_is_deterministic():
    tok = Tokenizer.for_text(STORY, "char")
    ids = tok.encode(STORY)
    cfg = LMConfig(**{**TINY, "vocab_size": tok.vocab_size}, attn="rbf")
    settings = TrainSettings(steps=12, batch_size=8, lr=3e-3, warmup=2, eval_every=6, eval_batches=2)
    model, history = train_lm(ids, cfg, settings, seed=3, progress=False)
    _, again = train_lm(ids, cfg, settings, seed=3, progress=False)
    assert [r["step"] for r in history] == [0, 6, 12]
    assert history[-1]["val_loss"] < history[0]["val_loss"] - 0.25
    assert [r["val_loss"] for r in history] == [r["val_loss"] for r in again]
    assert not model.training


def test_checkpoint_round_trip_and_bad_files(tmp_path):
    model, _ = random_model(attn="rbf", num_registers=1)
    model = model.float()
    tok = Tokenizer("char", "abcdefghijklmnopqrstuvwxyz .,!\n")
    path = save_lm(tmp_path / "lm.safetensors", model, tok, {"note": "test"})
    loaded, tok2, meta = load_lm(path)
    idx = torch.randint(0, 31, (2, 10))
    torch.testing.assert_close(loaded(idx), model(idx), rtol=0, atol=0)
    assert tok2.chars == tok.chars and meta["note"] == "test" and "software" in meta
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_lm(tmp_path / "junk.safetensors")
    (tmp_path / "empty.safetensors").write_bytes(b"")  # the checks every checkpoint reader shares
    with pytest.raises(CheckpointError, match="empty"):
        load_lm(tmp_path / "empty.safetensors")
    (tmp_path / "lm.pt").write_bytes(b"\x80\x02}q\x00.")
    with pytest.raises(CheckpointError, match="never unpickles"):
        load_lm(tmp_path / "lm.pt")
    from ssog_core import ViT, save_checkpoint

    vit = save_checkpoint(tmp_path / "vit.safetensors", ViT(num_classes=2, dim=8, depth=1, num_heads=2, attn="dot"))
    with pytest.raises(CheckpointError, match="not a language-model checkpoint"):
        load_lm(vit)


def test_tokenizers():
    byte = Tokenizer("byte")
    text = "naïve café ✓\n"
    assert byte.decode(byte.encode(text).tolist()) == text and byte.vocab_size == 256
    char = Tokenizer.for_text(text, "char")
    assert char.decode(char.encode(text).tolist()) == text and char.vocab_size == len(set(text))
    with pytest.raises(ValueError, match="not in the tokenizer's alphabet: 'z'"):
        char.encode("zen")


def test_generate_extends_the_prompt():
    model, _ = random_model(attn="rbf", position="learned")
    out = model.float().generate(torch.tensor([[1, 2, 3]]), 30, generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 33) and torch.equal(out[0, :3], torch.tensor([1, 2, 3]))  # runs past the context (24)


@pytest.mark.slow
def test_cli_trains_both_kinds_writes_curves_and_samples(tmp_path, capsys):
    text = tmp_path / "story.txt"
    text.write_text(STORY, encoding="utf-8")
    out = tmp_path / "run"
    args = ["--text", str(text), "--attn", "dot,rbf", "--out", str(out), "--tokenizer", "char", "--steps", "4"]
    args += ["--eval-every", "2", "--eval-batches", "1", "--batch-size", "4", "--context", "16", "--dim", "16"]
    args += ["--depth", "1", "--heads", "2", "--sample-tokens", "20", "--prompt", "The ", "--quiet", "--device", "cpu"]
    main(args)
    printed = capsys.readouterr().out
    assert "dot train" in printed and "rbf val" in printed
    assert "--- sample (dot) ---\nThe " in printed and "--- sample (rbf) ---\nThe " in printed
    records = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    assert [(r["attn"], r["step"]) for r in records] == [(k, s) for k in ("dot", "rbf") for s in (0, 2, 4)]
    with Image.open(out / "losses.png") as im:
        assert im.format == "PNG" and im.size[0] > 300
    main(["--sample-from", str(out / "lm-rbf.safetensors"), "--prompt", "Once", "--sample-tokens", "15"])
    assert len(capsys.readouterr().out.strip()) >= 10


@pytest.mark.parametrize(
    "args, message",
    [
        (["--attn", "dot,ssog"], "give distinct kinds"),
        (["--val-fraction", "0.0"], "too short to hold out"),
        (["--heads", "5"], "divisible by num_heads"),
    ],
)
def test_cli_errors_are_clear(tmp_path, capsys, args, message):
    text = tmp_path / "t.txt"
    text.write_text("hello world, hello cats\n" * 3, encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["--text", str(text), "--steps", "1", "--dim", "16", "--out", str(tmp_path / "o"), *args])
    assert message in capsys.readouterr().err

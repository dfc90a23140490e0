"""The ViT against the dense float64 oracle; counting; resolution transfer; torch.compile."""

from __future__ import annotations

import pytest
import torch

from ssog_core.cli.info import main as info_main
from ssog_core.nn.config import SEED_CONFIGS, ViTConfig
from ssog_core.nn.cost import count_flops, count_params
from ssog_core.nn.vit import ViT
from tests.dense_oracle import upstream_state_dict, vit_forward

SMALL = dict(num_classes=7, img_size=20, patch_size=4, dim=12, depth=2, num_heads=3, num_atoms=3)


def upstream_layout_model(cfg: dict, taps=("mu", "sigma", "lambda")) -> tuple[ViT, dict]:
    """A float64 ViT holding random upstream-layout weights (gates open, probes active)."""
    sd = upstream_state_dict(cfg, taps=taps)
    model = ViT(**cfg, steer=taps if cfg["attn"] != "dot" else ()).double().eval()
    model.load_state_dict({k: v.double() for k, v in sd.items()})
    return model, sd


@pytest.mark.parametrize(
    "attn, field, taps",
    [
        ("ssog", "factorized", ("mu", "sigma", "lambda")),
        ("ssog", "axial", ("mu", "sigma", "lambda")),
        ("ssog", "factorized", ()),
        ("ssog", "axial", ("lambda",)),
        ("dot", "factorized", ()),
    ],
)
def test_logits_match_dense_oracle(attn, field, taps):
    cfg = dict(SMALL, attn=attn, field=field)
    model, sd = upstream_layout_model(cfg, taps)
    img = torch.rand(2, 3, 20, 20, dtype=torch.float64)
    want, _ = vit_forward(img, sd, cfg)
    torch.testing.assert_close(model(img), want, rtol=1e-10, atol=1e-10)


def test_non_square_image_and_resolution_transfer_match_the_oracle():
    cfg = dict(SMALL, attn="ssog")
    model, sd = upstream_layout_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    img = torch.rand(2, 3, 28, 16, dtype=torch.float64)  # 7×4 grid from a 5×5-trained model
    want, _ = vit_forward(img, sd, cfg)
    torch.testing.assert_close(model(img), want, rtol=1e-10, atol=1e-10)
    for k, v in model.state_dict().items():  # field (and every other) parameter untouched
        assert torch.equal(v, before[k]), k


def test_resolution_transfer_32_to_48():
    model = ViT(num_classes=10, img_size=32, patch_size=4, dim=16, depth=2, num_heads=2).eval()
    field_before = [b.attn.fixed_field() for b in model.blocks]
    out = model(torch.rand(3, 3, 48, 48))
    assert out.shape == (3, 10) and torch.isfinite(out).all()
    assert model.pos_embed_for((8, 8)) is model.pos_embed
    assert model.pos_embed_for((12, 12)).shape == (1, 144, 16)
    for b, f in zip(model.blocks, field_before, strict=True):
        g = b.attn.fixed_field()
        assert torch.equal(g.mu, f.mu) and torch.equal(g.sigma, f.sigma) and torch.equal(g.tau, f.tau)
    with pytest.raises(ValueError, match="not a positive multiple of the patch size 4"):
        model(torch.rand(1, 3, 30, 32))


def test_every_parameter_gets_a_gradient():
    model = ViT(**SMALL, cold_init=False)
    for name, p in model.named_parameters():  # zero-initialised probes would block the gates' gradients
        if "delta" in name or "lambda_gate" in name:
            torch.nn.init.normal_(p, std=0.1)
    model(torch.rand(2, 3, 20, 20)).logsumexp(-1).sum().backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


@pytest.mark.parametrize("name", list(SEED_CONFIGS))
def test_seed_parameter_counts_are_exact(name):
    cfg, params, _ = SEED_CONFIGS[name]
    with torch.device("meta"):
        assert count_params(ViT(cfg)) == params


@pytest.mark.parametrize("name", [n for n, (_, _, f) in SEED_CONFIGS.items() if f])
def test_seed_flops_within_15_percent(name):
    cfg, _, flops = SEED_CONFIGS[name]
    with torch.device("meta"):
        model = ViT(cfg)
    assert abs(count_flops(model) / flops - 1) <= 0.15


def test_info_cli_prints_the_seed_table_and_refuses_bad_configs(capsys):
    info_main([])
    out = capsys.readouterr().out
    for _, params, _ in SEED_CONFIGS.values():
        assert f"{params:,}" in out
    info_main(["--config", '{"dim": 32, "depth": 1, "num_heads": 2, "attn": "dot", "num_classes": 3}'])
    assert "given" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        info_main(["--config", '{"dimm": 32}'])
    assert "unknown model config field(s): dimm" in capsys.readouterr().err


def test_config_validation_messages():
    with pytest.raises(ValueError, match="num_atoms=9 must be between 1 and 8"):
        ViTConfig(num_atoms=9)
    with pytest.raises(ValueError, match="multiples of patch_size"):
        ViTConfig(img_size=30, patch_size=4)
    with pytest.raises(ValueError, match="distinct taps"):
        ViTConfig(steer=("mu", "nu"))
    with pytest.raises(ValueError, match="register tokens have no grid position"):
        ViTConfig(num_registers=2)
    cfg = ViTConfig(img_size=(24, 16), patch_size=8, steer=("sigma",))
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg and cfg.grid == (3, 2)


def test_dot_registers_are_prefix_tokens_stripped_after_the_last_block():
    model = ViT(
        num_classes=3, img_size=16, patch_size=4, dim=8, depth=1, num_heads=2, attn="dot", num_registers=2
    ).eval()
    assert model.registers.abs().sum() > 0
    x, grid = model.embed(torch.rand(1, 3, 16, 16))
    assert x.shape == (1, 18, 8) and grid == (4, 4)
    assert model.forward_features(torch.rand(1, 3, 16, 16)).shape == (1, 16, 8)


@pytest.mark.slow
def test_torch_compile_forward_and_backward():
    model = ViT(num_classes=5, img_size=(12, 8), patch_size=4, dim=16, depth=1, num_heads=2, cold_init=False).eval()
    img = torch.rand(2, 3, 12, 8)
    compiled = torch.compile(model, fullgraph=True)
    out = compiled(img)
    out.sum().backward()
    torch.testing.assert_close(out, model(img), rtol=1e-4, atol=1e-5)
    assert model.blocks[0].attn.mu.grad is not None

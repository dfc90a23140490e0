"""Opening standard ViT folders: timm's architecture table, hf-hub: from the local cache, class names, weights in
pytorch_model.bin, and every refusal (each with its sentence) for what the lab does not open."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from ssog_core import CheckpointError, load_checkpoint
from ssog_core.checkpoint.standard import MAX_PARAMETERS, _timm_arch_args, imagenet_classes
from tests.helpers import RunsCode, weights
from tests.test_standard_vit import SMALL, _hf, _hf_folder, timm_state, write_timm_folder

transformers = pytest.importorskip("transformers")

# name → (embed_dim, depth, num_heads, patch_size, what else timm's definition sets), from timm's model definitions
TABLE = {
    "vit_tiny_patch16_384": (192, 12, 3, 16, dict(img_size=384)),
    "vit_base_patch16_224.augreg2_in21k_ft_in1k": (768, 12, 12, 16, dict(img_size=224)),
    "vit_large_patch14_224": (1024, 24, 16, 14, dict(img_size=224)),
    "vit_huge_patch14_224": (1280, 32, 16, 14, dict(img_size=224)),
    "vit_small_patch14_dinov2": (384, 12, 6, 14, dict(init_values=1e-5, img_size=518)),
    "vit_large_patch14_reg4_dinov2.lvd142m": (
        1024,
        24,
        16,
        14,
        dict(init_values=1e-5, reg_tokens=4, no_embed_class=True, img_size=518),
    ),  # fmt: skip
    "deit_tiny_distilled_patch16_224": (192, 12, 3, 16, dict(distilled=True, img_size=224)),
    "deit_base_patch16_384": (768, 12, 12, 16, dict(img_size=384)),
    "deit3_medium_patch16_224": (512, 12, 8, 16, dict(no_embed_class=True, init_values=1e-6, img_size=224)),
    "deit3_huge_patch14_224": (1280, 32, 16, 14, dict(no_embed_class=True, init_values=1e-6, img_size=224)),
    "vit_base_patch16_gap_224": (
        768,
        12,
        16,
        16,
        dict(class_token=False, global_pool="avg", fc_norm=False, img_size=224),
    ),  # fmt: skip
    "vit_medium_patch16_gap_256": (
        512,
        12,
        8,
        16,
        dict(class_token=False, global_pool="avg", qkv_bias=False, init_values=1e-6, fc_norm=False, img_size=256),
    ),  # fmt: skip
    "vit_mediumd_patch16_reg4_gap_384": (
        512,
        20,
        8,
        16,
        dict(class_token=False, global_pool="avg", no_embed_class=True, reg_tokens=4, init_values=1e-5, img_size=384),
    ),  # fmt: skip
    "vit_betwixt_patch16_reg1_gap_256": (
        640,
        12,
        10,
        16,
        dict(class_token=False, global_pool="avg", no_embed_class=True, reg_tokens=1, init_values=1e-5, img_size=256),
    ),  # fmt: skip
    "vit_base_patch16_reg4_gap_256": (
        768,
        12,
        12,
        16,
        dict(class_token=False, global_pool="avg", no_embed_class=True, reg_tokens=4, img_size=256),
    ),  # fmt: skip
}


@pytest.mark.parametrize("name", list(TABLE))
def test_timm_names_give_timms_arguments(name):
    dim, depth, heads, patch, extra = TABLE[name]
    assert _timm_arch_args(name) == dict(embed_dim=dim, depth=depth, num_heads=heads, patch_size=patch, **extra)


@pytest.mark.parametrize(
    "name",
    [
        "vit_base_patch16_clip_224",
        "vit_base_patch16_siglip_224",
        "swin_base_patch4_window7_224",
        "vit_giant_patch14_dinov2",
    ],
)
def test_timm_names_outside_the_standard_vit_are_not_in_the_table(name):
    assert _timm_arch_args(name) is None


def _timm(tmp_path: Path, arch: str = "vit_base_patch16_224", args: dict | None = None, **top) -> Path:
    args = dict(SMALL) if args is None else args
    return write_timm_folder(tmp_path / "m", arch, timm_state(args), args, **top)


def _refused(folder, *phrases: str) -> str:
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(folder)
    for phrase in phrases:
        assert phrase in str(e.value), str(e.value)
    return str(e.value)


def _rewrite_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key].update(value)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


def test_unknown_model_args_keys_are_refused_by_name(tmp_path):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args={"window_size": 7, "rope_type": "axial"})
    _refused(folder, "unknown model_args key(s) rope_type, window_size", "a standard ViT takes")


@pytest.mark.parametrize(
    "change, phrase",
    [
        ({"global_pool": "map"}, "global_pool='map' (supported: 'token', 'avg')"),
        ({"act_layer": "quick_gelu"}, "act_layer='quick_gelu' (supported: (None, 'gelu'))"),
        ({"pre_norm": True}, "pre_norm=True (supported: (False,))"),
        ({"pos_embed": "none"}, "pos_embed='none' (supported: ('learn',))"),
    ],
)
def test_timm_arguments_that_change_the_architecture_are_refused(tmp_path, change, phrase):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args=change)
    _refused(folder, "is not a standard ViT this lab runs", phrase)


def test_a_config_that_contradicts_itself_is_refused_in_words(tmp_path):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args={"class_token": False})  # global_pool stays 'token'
    _refused(folder, "pool='token' reads the class token, which this model does not have")


def test_non_vit_timm_architectures_are_refused_with_what_is_supported(tmp_path):
    folder = _timm(tmp_path)
    _rewrite_config(folder, architecture="swin_base_patch4_window7_224")
    _refused(
        folder,
        "'swin_base_patch4_window7_224' is not an architecture SSOG Lab opens",
        "vit_*_patch14_dinov2",
        "windowed or relative-position attention",
    )


def test_a_vit_name_outside_the_table_opens_when_model_args_give_its_sizes(tmp_path):
    folder = _timm(tmp_path, "vit_custom_patch7_28")
    model, meta = load_checkpoint(folder)
    assert model.config.dim == 24 and meta["source"]["architecture"] == "vit_custom_patch7_28"
    config = json.loads((folder / "config.json").read_text())
    config["model_args"].pop("num_heads")
    (folder / "config.json").write_text(json.dumps(config))
    _refused(folder, "'vit_custom_patch7_28' is not an architecture SSOG Lab opens")


@pytest.mark.parametrize(
    "change, phrase",
    [
        ({"model_type": "swin"}, "model_type 'swin' is not supported: SSOG Lab opens timm's VisionTransformer"),
        ({"architectures": ["ViTForMaskedImageModeling"]}, "architecture 'ViTForMaskedImageModeling' is not one"),
        ({"hidden_act": "gelu_new"}, "hidden_act='gelu_new' (supported: 'gelu')"),
        ({"hidden_size": "24"}, "hidden_size='24' must be whole numbers"),
    ],
)
def test_transformers_configs_outside_the_standard_vit_are_refused(tmp_path, change, phrase):
    folder = _hf_folder(_hf("vit", "ViTForImageClassification"), tmp_path / "m")
    _rewrite_config(folder, **change)
    _refused(folder, phrase)


def test_swiglu_dinov2_is_refused(tmp_path):
    folder = _hf_folder(_hf("dinov2", "Dinov2ForImageClassification"), tmp_path / "m")
    _rewrite_config(folder, use_swiglu_ffn=True)
    _refused(folder, "use_swiglu_ffn=true (a SwiGLU MLP")


def test_a_transformers_folder_without_its_preprocessor_config_is_refused(tmp_path):
    folder = _hf_folder(_hf("vit", "ViTForImageClassification"), tmp_path / "m")
    (folder / "preprocessor_config.json").unlink()
    _refused(folder, "m has no preprocessor_config.json, so the image mean and std are not known")


def test_a_timm_config_without_mean_and_std_is_refused(tmp_path):
    folder = _timm(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["pretrained_cfg"]["mean"]
    (folder / "config.json").write_text(json.dumps(config))
    _refused(folder, "pretrained_cfg gives no mean and std")


def test_weights_that_do_not_fit_are_reported_all_at_once(tmp_path):
    folder = _timm(tmp_path)
    state = weights(folder / "model.safetensors")
    del state["blocks.1.norm2.bias"]
    state["blocks.0.attn.qkv.weight"] = torch.zeros(72, 20)
    state["blocks.0.attn.gate.weight"] = torch.zeros(24, 24)
    state["head.bias"] = torch.full((5,), float("nan"))
    from safetensors.torch import save_file

    save_file(state, str(folder / "model.safetensors"))
    _refused(
        folder,
        "missing tensors: blocks.1.norm2.bias",
        "unexpected tensors: blocks.0.attn.gate.weight",
        "blocks.0.attn.qkv.weight has shape (72, 20), expected (72, 24)",
        "head.bias contains NaN",
    )


def test_transformers_weights_that_do_not_fit_name_transformers_tensors(tmp_path):
    folder = _hf_folder(_hf("vit", "ViTForImageClassification"), tmp_path / "m")
    state = weights(folder / "model.safetensors")
    del state["vit.encoder.layer.1.attention.attention.key.weight"]
    from safetensors.torch import save_file

    save_file(state, str(folder / "model.safetensors"))
    _refused(
        folder, "vit.encoder.layer.1.attention.attention.query.weight", "missing tensors: blocks.1.attn.qkv.weight"
    )


def test_a_config_claiming_more_layers_than_the_weights_hold_is_refused(tmp_path):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args={"depth": 3})
    _refused(folder, "the config says 3 layers, the weights hold 2")


def test_a_config_naming_a_billion_parameters_is_refused_before_anything_is_allocated(tmp_path):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args={"embed_dim": 4096, "depth": 48, "num_heads": 32})
    start = time.perf_counter()
    message = _refused(folder, "parameters, over the", f"{MAX_PARAMETERS:,} SSOG Lab opens")
    assert time.perf_counter() - start < 5
    assert int(message.split(" describes ")[1].split(" ")[0].replace(",", "")) > 1e9


@pytest.mark.parametrize(
    "change, phrase",
    [
        ({"mlp_ratio": 1e30}, "describes a model too large to build"),
        ({"img_size": 7 * 10**9}, "describes a model too large to build"),
        ({"reg_tokens": "4", "depth": 2.0}, "depth=2.0, reg_tokens='4' must be whole numbers"),
    ],
)
def test_sizes_past_reason_are_refused_in_words(tmp_path, change, phrase):
    folder = _timm(tmp_path)
    _rewrite_config(folder, model_args=change)
    _refused(folder, phrase)


def test_pytorch_model_bin_is_read_as_tensors_only(tmp_path):
    folder = _timm(tmp_path)
    reference, _ = load_checkpoint(folder)
    torch.save(weights(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    model, _ = load_checkpoint(folder)
    img = torch.rand(2, 3, 28, 28)
    assert torch.equal(model(img), reference(img))
    marker = tmp_path / "ran"
    torch.save({"head.weight": RunsCode(marker)}, folder / "pytorch_model.bin")
    _refused(folder, "pytorch_model.bin was refused: it contains objects other than tensors")
    assert not marker.exists()


def test_folders_without_weights_or_config_are_refused_in_words(tmp_path):
    folder = _timm(tmp_path)
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text("{}")
    _refused(folder, "m holds sharded weights: SSOG Lab reads model.safetensors")
    (folder / "config.json").unlink()
    _refused(folder, "m is not a model folder (no config.json)")
    (folder / "config.json").write_text(json.dumps({"hidden_size": 24}))
    _refused(folder, "names neither a timm architecture nor a transformers model_type")


def test_hf_hub_names_open_from_the_local_cache_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "cache" / "models--lab-org--tiny-vit"
    _hf_folder(_hf("vit", "ViTForImageClassification"), root / "snapshots" / commit)
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    model, meta = load_checkpoint("hf-hub:lab-org/tiny-vit")
    assert model.config.family == "vit" and meta["source"]["path"] == "hf-hub:lab-org/tiny-vit"
    assert load_checkpoint(f"hf-hub:lab-org/tiny-vit@{commit}")[0].config.dim == 24
    missing = root.parent / "models--lab-org--other" / "snapshots" / "main"
    _refused(
        "hf-hub:lab-org/other",
        f"hf-hub:lab-org/other is not in the local Hugging Face cache (no {missing}/config.json)",
        "hf download lab-org/other",
    )
    _refused("hf-hub:../etc", "is not hf-hub:ORG/NAME")


def test_class_names_come_from_the_config_else_imagenet_for_1000_classes_else_indices(tmp_path):
    hf = _hf("vit", "ViTForImageClassification", id2label={str(i): f"kind {i}" for i in range(5)})
    assert load_checkpoint(_hf_folder(hf, tmp_path / "hf"))[1]["class_names"] == [f"kind {i}" for i in range(5)]
    args = dict(SMALL, num_classes=1000)
    _, meta = load_checkpoint(write_timm_folder(tmp_path / "in1k", "vit_base_patch16_224", timm_state(args), args))
    names = meta["class_names"]
    assert (len(names), names[0], names[207], names[409], names[999]) == (
        1000,
        "tench, Tinca tinca",
        "golden retriever",
        "analog clock",
        "toilet tissue, toilet paper, bathroom tissue",
    )
    ids = list(imagenet_classes()[0])  # timm's ImageNet heads name their classes by WordNet id
    folder = write_timm_folder(tmp_path / "syn", "vit_base_patch16_224", timm_state(args), args, label_names=ids)
    assert load_checkpoint(folder)[1]["class_names"] == names
    folder = _timm(tmp_path, label_names=list("vwxyz"))
    assert load_checkpoint(folder)[1]["class_names"] == list("vwxyz")

"""The standard ViT against its references in float64: transformers' ViT, DeiT and DINOv2 classes (random weights,
folders written with save_pretrained), timm-layout folders (transformers' weights under timm's names, and timm's
forward written out below from timm's definition), hook points, and the lab's dot twin written as a timm folder.

timm itself is not imported (it is not installed here); ``timm_forward`` is timm's ``VisionTransformer.forward``
(``timm/models/vision_transformer.py``, ``timm/layers/attention.py``, ``resample_abs_pos_embed``) for the arguments
a standard ViT takes. transformers' eager attention takes its softmax in float32, so patterns compare at float32
tolerance; logits come from its default (SDPA) path, float64 throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from ssog_core import ViT, load_checkpoint, save_checkpoint
from ssog_core.checkpoint.standard import timm_twin, to_timm
from ssog_core.cli.convert import main as convert_main
from ssog_core.interventions.hooks import run_with_cache, run_with_hooks
from tests.helpers import weights

transformers = pytest.importorskip("transformers")

F64 = dict(rtol=1e-9, atol=1e-10)
F32_SOFTMAX = dict(rtol=1e-5, atol=2e-6)  # transformers' eager softmax runs in float32
MEAN, STD = [0.45, 0.5, 0.55], [0.22, 0.3, 0.26]
TINY = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, image_size=28, patch_size=7, num_labels=5)


def _randomise(model: torch.nn.Module, scale: float = 0.3) -> torch.nn.Module:
    """Every parameter random (norm gains near 1), so no term of the forward hides behind an initial zero or one."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            gain = p.dim() == 1 and name.endswith("weight") and "norm" in name
            p.copy_(1 + scale * torch.randn_like(p) if gain else scale * torch.randn_like(p))
    return model.eval()


def _hf(kind: str, arch: str, **overrides) -> torch.nn.Module:
    configs = {
        "vit": transformers.ViTConfig,
        "deit": transformers.DeiTConfig,
        "dinov2": transformers.Dinov2Config,
        "dinov2_with_registers": transformers.Dinov2WithRegistersConfig,
    }
    extra = dict(intermediate_size=40) if kind in ("vit", "deit") else dict(mlp_ratio=2)
    config = configs[kind](**{**TINY, **extra, **overrides})
    return _randomise(getattr(transformers, arch)(config))


def _hf_folder(model: torch.nn.Module, folder: Path) -> Path:
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(image_mean=MEAN, image_std=STD).save_pretrained(folder)
    return folder


def _normalised(img: Tensor) -> Tensor:
    return (img - torch.tensor(MEAN, dtype=img.dtype).view(1, 3, 1, 1)) / torch.tensor(STD, dtype=img.dtype).view(
        1, 3, 1, 1
    )


def _eager(model: torch.nn.Module, folder: Path) -> torch.nn.Module:
    """The same model with transformers' eager attention, the path that returns attention weights."""
    return type(model).from_pretrained(folder, attn_implementation="eager").double().eval()


def _hf_run(model, img: Tensor, resize: bool, **kwargs):
    extra = {"interpolate_pos_encoding": True} if resize and model.config.model_type in ("vit", "deit") else {}
    with torch.no_grad():
        return model(_normalised(img), **extra, **kwargs)


HF_CASES = [
    ("vit", "ViTForImageClassification", {}),
    ("deit", "DeiTForImageClassificationWithTeacher", {}),
    ("deit", "DeiTForImageClassification", {}),
    ("dinov2", "Dinov2ForImageClassification", {}),
    ("dinov2_with_registers", "Dinov2WithRegistersForImageClassification", dict(num_register_tokens=3)),
]
SIZES = [(28, 28), (49, 35), (21, 35)]  # the learned 4×4 grid, 7×5 (up), 3×5 (rows down: antialiasing matters)


@pytest.mark.parametrize("kind, arch, extra", HF_CASES, ids=[c[1] for c in HF_CASES])
def test_transformers_folders_give_the_same_logits_patterns_and_residuals(tmp_path, kind, arch, extra):
    hf = _hf(kind, arch, **extra)
    model, meta = load_checkpoint(_hf_folder(hf, tmp_path / "m"))
    assert meta["normalization"] is None and meta["class_names"] == [str(i) for i in range(5)]
    model, hf, eager_hf = model.double(), hf.double(), _eager(hf, tmp_path / "m")
    prefix = {"vit": 1, "deit": 2, "dinov2": 1}.get(kind, 1 + extra.get("num_register_tokens", 0))
    assert model.num_prefix_tokens == prefix
    for h, w in SIZES:
        img = torch.rand(2, 3, h, w, dtype=torch.float64)
        logits, cache = run_with_cache(model, img)
        ref = _hf_run(hf, img, resize=(h, w) != (28, 28), output_hidden_states=True)
        torch.testing.assert_close(logits, ref.logits, **F64)
        eager = _hf_run(eager_hf, img, resize=(h, w) != (28, 28), output_attentions=True)
        t = prefix + (h // 7) * (w // 7)
        for layer in range(2):
            pattern = cache[f"blocks.{layer}.attn.pattern"]
            assert pattern.shape == (2, 3, t, t)
            torch.testing.assert_close(pattern, eager.attentions[layer], **F32_SOFTMAX)
            torch.testing.assert_close(cache[f"blocks.{layer}.resid_post"], ref.hidden_states[layer + 1], **F64)
            assert cache[f"blocks.{layer}.attn.head_out"].shape == (2, t, 3, 8)
            assert cache[f"blocks.{layer}.attn.hook_in"].shape == (2, t, 24)


def test_the_two_resize_rules_differ_where_the_comparisons_above_use_them():
    """DINOv2 with registers antialiases, ViT does not: at the downsampled grid above the two rules give different
    embeddings, so matching transformers there checks the rule, not just the shape."""
    pe = torch.randn(1, 24, 6, 6, dtype=torch.float64)
    plain = F.interpolate(pe, size=(3, 5), mode="bicubic", align_corners=False)
    smooth = F.interpolate(pe, size=(3, 5), mode="bicubic", align_corners=False, antialias=True)
    assert (plain - smooth).abs().max() > 1e-2


# --- timm: its forward, written out from its definition, and folders in its layout ---


TIMM_ARGS = dict(  # VisionTransformer's defaults, for the keys a standard ViT uses
    img_size=224, patch_size=16, in_chans=3, num_classes=1000, global_pool="token", embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False, proj_bias=True, init_values=None, class_token=True,
    no_embed_class=False, reg_tokens=0, fc_norm=None,
)  # fmt: skip


def _ln(x: Tensor, s: dict[str, Tensor], name: str) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], s[name + ".weight"], s[name + ".bias"], eps=1e-6)


def timm_forward(s: dict[str, Tensor], args: dict, img: Tensor, distilled: bool = False, patterns=None):
    """timm's VisionTransformer (or VisionTransformerDistilled) forward in float64 on normalised pixels; returns the
    output and each layer's attention. ``patterns`` maps a layer to the attention that replaces its own."""
    a = {**TIMM_ARGS, **args}
    s = {k: v.double() for k, v in s.items()}
    p, dim, heads = a["patch_size"], a["embed_dim"], a["num_heads"]
    size = (a["img_size"],) * 2 if isinstance(a["img_size"], int) else tuple(a["img_size"])
    x = F.conv2d(img, s["patch_embed.proj.weight"], s["patch_embed.proj.bias"], stride=p)  # PatchEmbed
    b, _, gh, gw = x.shape
    x = x.flatten(2).transpose(1, 2)
    to_cat = [s[k].expand(b, -1, -1) for k in ("cls_token", "dist_token", "reg_token") if k in s]
    n_prefix = len(to_cat) - ("reg_token" in s) + a["reg_tokens"]
    pos, grid = s["pos_embed"], (size[0] // p, size[1] // p)
    keep = 0 if a["no_embed_class"] else n_prefix
    if (gh, gw) != grid:  # resample_abs_pos_embed: bicubic, antialias, in float32
        pe = pos[:, keep:].float().reshape(1, *grid, -1).permute(0, 3, 1, 2)
        pe = (
            F.interpolate(pe, size=(gh, gw), mode="bicubic", antialias=True).permute(0, 2, 3, 1).reshape(1, gh * gw, -1)
        )
        pos = torch.cat([pos[:, :keep], pe.double()], dim=1)
    x = torch.cat([*to_cat, x + pos], dim=1) if a["no_embed_class"] else torch.cat([*to_cat, x], dim=1) + pos
    attns = []
    for i in range(a["depth"]):
        k_ = f"blocks.{i}."
        h = _ln(x, s, k_ + "norm1")
        qkv = F.linear(h, s[k_ + "attn.qkv.weight"], s.get(k_ + "attn.qkv.bias"))
        q, k, v = qkv.reshape(b, -1, 3, heads, dim // heads).permute(2, 0, 3, 1, 4).unbind(0)
        if a["qk_norm"]:
            q, k = _ln(q, s, k_ + "attn.q_norm"), _ln(k, s, k_ + "attn.k_norm")
        attn = ((q * (dim // heads) ** -0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
        attn = (patterns or {}).get(i, attn)
        attns.append(attn)
        y = F.linear(
            (attn @ v).transpose(1, 2).reshape(b, -1, dim), s[k_ + "attn.proj.weight"], s.get(k_ + "attn.proj.bias")
        )
        x = x + (y * s[k_ + "ls1.gamma"] if a["init_values"] else y)
        y = F.linear(
            F.gelu(F.linear(_ln(x, s, k_ + "norm2"), s[k_ + "mlp.fc1.weight"], s.get(k_ + "mlp.fc1.bias"))),
            s[k_ + "mlp.fc2.weight"],
            s.get(k_ + "mlp.fc2.bias"),
        )
        x = x + (y * s[k_ + "ls2.gamma"] if a["init_values"] else y)
    fc_norm = a["global_pool"] == "avg" if a["fc_norm"] is None else a["fc_norm"]
    x = x if fc_norm else _ln(x, s, "norm")
    if distilled:
        return (
            F.linear(x[:, 0], s["head.weight"], s["head.bias"])
            + F.linear(x[:, 1], s["head_dist.weight"], s["head_dist.bias"])
        ) / 2, attns
    pooled = x[:, 0] if a["global_pool"] == "token" else x[:, n_prefix:].mean(dim=1)
    pooled = _ln(pooled, s, "fc_norm") if fc_norm else pooled
    return (F.linear(pooled, s["head.weight"], s["head.bias"]) if a["num_classes"] else pooled), attns


def timm_state(args: dict, distilled: bool = False) -> dict[str, Tensor]:
    """Random tensors under timm's names and shapes for these VisionTransformer arguments (norm gains near 1)."""
    a = {**TIMM_ARGS, **args}
    d, p, c, hd = a["embed_dim"], a["patch_size"], a["in_chans"], a["embed_dim"] // a["num_heads"]
    size = (a["img_size"],) * 2 if isinstance(a["img_size"], int) else tuple(a["img_size"])
    n_prefix = int(a["class_token"]) + int(distilled) + a["reg_tokens"]
    n = (size[0] // p) * (size[1] // p) + (0 if a["no_embed_class"] else n_prefix)
    hidden = int(d * a["mlp_ratio"])
    shapes = {"patch_embed.proj.weight": (d, c, p, p), "patch_embed.proj.bias": (d,), "pos_embed": (1, n, d)}
    shapes.update({"cls_token": (1, 1, d)} if a["class_token"] else {})
    shapes.update(
        {"dist_token": (1, 1, d), "head_dist.weight": (a["num_classes"], d), "head_dist.bias": (a["num_classes"],)}
        if distilled
        else {}
    )
    shapes.update({"reg_token": (1, a["reg_tokens"], d)} if a["reg_tokens"] else {})
    for i in range(a["depth"]):
        k = f"blocks.{i}."
        shapes.update(
            {k + "norm1.weight": (d,), k + "norm1.bias": (d,), k + "norm2.weight": (d,), k + "norm2.bias": (d,)}
        )
        shapes.update({k + "attn.qkv.weight": (3 * d, d), k + "attn.proj.weight": (d, d)})
        shapes.update({k + "mlp.fc1.weight": (hidden, d), k + "mlp.fc2.weight": (d, hidden)})
        shapes.update({k + "attn.qkv.bias": (3 * d,)} if a["qkv_bias"] else {})
        shapes.update(
            {k + "attn.proj.bias": (d,), k + "mlp.fc1.bias": (hidden,), k + "mlp.fc2.bias": (d,)}
            if a["proj_bias"]
            else {}
        )
        shapes.update({k + "ls1.gamma": (d,), k + "ls2.gamma": (d,)} if a["init_values"] else {})
        shapes.update(
            {k + f"attn.{q}_norm.{w}": (hd,) for q in "qk" for w in ("weight", "bias")} if a["qk_norm"] else {}
        )
    fc_norm = a["global_pool"] == "avg" if a["fc_norm"] is None else a["fc_norm"]
    shapes.update({("fc_norm" if fc_norm else "norm") + w: (d,) for w in (".weight", ".bias")})
    if a["num_classes"]:
        shapes.update({"head.weight": (a["num_classes"], d), "head.bias": (a["num_classes"],)})
    gain = lambda k: "norm" in k and k.endswith("weight")  # noqa: E731
    return {k: (1 + 0.3 * torch.randn(s)) if gain(k) else 0.3 * torch.randn(s) for k, s in shapes.items()}


def write_timm_folder(folder: Path, arch: str, state: dict[str, Tensor], model_args: dict, **top) -> Path:
    """A folder in timm's Hugging Face layout (what ``timm.models.push_to_hf_hub`` writes)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.float().contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    size = model_args.get("img_size", 224)
    size = [size, size] if isinstance(size, int) else list(size)
    pretrained = dict(
        input_size=[3, *size],
        fixed_input_size=True,
        mean=MEAN,
        std=STD,
        num_classes=model_args.get("num_classes", 1000),
    )
    config = dict(
        architecture=arch, num_classes=pretrained["num_classes"], model_args=model_args, pretrained_cfg=pretrained
    )
    (folder / "config.json").write_text(json.dumps({**config, **top}))
    return folder


SMALL = dict(img_size=28, patch_size=7, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=5)
TIMM_CASES = {  # variants no transformers class has, each against timm_forward
    "qk_norm": ("vit_small_patch16_224", dict(SMALL, qk_norm=True)),
    "avg_no_class_token": ("vit_base_patch16_224", dict(SMALL, class_token=False, global_pool="avg")),
    "avg_no_fc_norm_no_bias": (
        "vit_base_patch16_224",
        dict(SMALL, class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, proj_bias=False),
    ),  # fmt: skip
    "registers_no_class_token": ("vit_medium_patch16_reg4_gap_256", dict(SMALL, reg_tokens=2)),
    "registers_embedded": ("vit_base_patch16_224", dict(SMALL, reg_tokens=2, init_values=1e-5)),
    "deit3_layer_scale": ("deit3_small_patch16_224", dict(SMALL, img_size=[35, 21])),
    "dinov2_reg4_features": ("vit_small_patch14_reg4_dinov2", dict(SMALL, num_classes=0)),
}


@pytest.mark.parametrize("case", list(TIMM_CASES))
def test_timm_folders_follow_timms_forward(tmp_path, case):
    arch, args = TIMM_CASES[case]
    state = timm_state({**_arch_defaults(arch), **args})
    model, _ = load_checkpoint(write_timm_folder(tmp_path / "m", arch, state, args))
    model = model.double()
    size = args["img_size"] if isinstance(args["img_size"], list) else [args["img_size"]] * 2
    for h, w in [tuple(size), (49, 35), (21, 14)]:
        img = torch.rand(2, 3, h, w, dtype=torch.float64)
        logits, cache = run_with_cache(model, img)
        ref, attns = timm_forward(state, {**_arch_defaults(arch), **args}, _normalised(img))
        torch.testing.assert_close(logits, ref, **F64)
        for layer, a in enumerate(attns):
            torch.testing.assert_close(cache[f"blocks.{layer}.attn.pattern"], a, **F64)


def _arch_defaults(arch: str) -> dict:
    """The arguments the architecture name adds in timm (for the reference; the lab reads them from its table)."""
    return {
        "vit_medium_patch16_reg4_gap_256": dict(
            class_token=False, no_embed_class=True, global_pool="avg", init_values=1e-5, reg_tokens=4
        ),  # fmt: skip
        "deit3_small_patch16_224": dict(no_embed_class=True, init_values=1e-6),
        "vit_small_patch14_reg4_dinov2": dict(init_values=1e-5, no_embed_class=True, reg_tokens=4),
    }.get(arch, {})


def _hf_to_timm(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """transformers' ViT / DeiT / DINOv2 names → timm's: the public mapping of transformers' conversion scripts
    (convert_vit_timm_to_pytorch.py, convert_deit_timm_to_pytorch.py, convert_dinov2_to_hf.py), read backwards."""
    rename = {
        "embeddings.cls_token": "cls_token", "embeddings.distillation_token": "dist_token",
        "embeddings.position_embeddings": "pos_embed", "embeddings.patch_embeddings.projection": "patch_embed.proj",
        "layernorm": "norm", "classifier": "head", "cls_classifier": "head", "distillation_classifier": "head_dist",
    }  # fmt: skip
    layer = {
        "layernorm_before": "norm1", "layernorm_after": "norm2", "intermediate.dense": "mlp.fc1",
        "output.dense": "mlp.fc2", "attention.output.dense": "attn.proj", "norm1": "norm1", "norm2": "norm2",
        "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2", "layer_scale1": "ls1", "layer_scale2": "ls2",
    }  # fmt: skip
    out = {}
    for key, t in state.items():
        name = key.removeprefix(prefix + ".")
        module, _, leaf = name.rpartition(".")
        if name == "embeddings.mask_token":
            continue
        if name.startswith("encoder.layer."):
            i, rest = name.split(".")[2], ".".join(module.split(".")[3:])
            if rest.startswith("attention.attention."):
                continue  # q, k, v: joined below
            leaf = "gamma" if leaf == "lambda1" else leaf
            out[f"blocks.{i}.{layer[rest]}.{leaf}"] = t
        elif name in rename:
            out[rename[name]] = t
        else:
            out[f"{rename[module]}.{leaf}"] = t
    for key in [k for k in state if k.endswith("attention.attention.query.weight")]:
        i = key.split("encoder.layer.")[1].split(".")[0]
        for leaf in ("weight", "bias"):
            parts = [state[key.replace("query.weight", f"{q}.{leaf}")] for q in ("query", "key", "value")]
            out[f"blocks.{i}.attn.qkv.{leaf}"] = torch.cat(parts)
    return out


TIMM_FROM_HF = [  # (transformers class, its config, timm architecture, what timm's model_args must say)
    ("vit", "ViTForImageClassification", "vit_base_patch16_224", dict(SMALL, mlp_ratio=40 / 24)),
    (
        "deit",
        "DeiTForImageClassificationWithTeacher",
        "deit_base_distilled_patch16_224",
        dict(SMALL, mlp_ratio=40 / 24),
    ),
    ("dinov2", "Dinov2Model", "vit_small_patch14_dinov2", dict(SMALL, num_classes=0)),
]


@pytest.mark.parametrize("kind, arch, timm_arch, args", TIMM_FROM_HF, ids=[c[2] for c in TIMM_FROM_HF])
def test_timm_folders_of_transformers_weights_give_transformers_outputs(tmp_path, kind, arch, timm_arch, args):
    hf = _hf(kind, arch, layer_norm_eps=1e-6)  # timm's epsilon
    hf.save_pretrained(tmp_path / "hf")  # the names a transformers folder holds
    timm = _hf_to_timm(weights(tmp_path / "hf" / "model.safetensors"), hf.base_model_prefix)
    model, _ = load_checkpoint(write_timm_folder(tmp_path / "t", timm_arch, timm, args))
    model = model.double()
    img = torch.rand(2, 3, 28, 28, dtype=torch.float64)
    logits, cache = run_with_cache(model, img)
    ref = _hf_run(_eager(hf, tmp_path / "hf"), img, resize=False, output_attentions=True)
    out = ref.pooler_output if kind == "dinov2" else ref.logits
    torch.testing.assert_close(logits, out, rtol=1e-6, atol=1e-6)  # eager: its softmax in float32
    for layer in range(2):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.pattern"], ref.attentions[layer], **F32_SOFTMAX)


# --- hook points ---


def test_a_pattern_hook_changes_the_output_as_a_float64_computation_says(tmp_path):
    args = dict(SMALL, reg_tokens=1, init_values=1e-5)
    state = timm_state(args)
    model, _ = load_checkpoint(write_timm_folder(tmp_path / "m", "vit_base_patch16_224", state, args))
    model = model.double()
    img = torch.rand(2, 3, 49, 35, dtype=torch.float64)
    t = 2 + 35
    new = torch.rand(2, 3, t, t, dtype=torch.float64).softmax(dim=-1)
    hooked = run_with_hooks(model, img, {"blocks.1.attn.pattern": lambda a, name: new})
    ref, _ = timm_forward(state, args, _normalised(img), patterns={1: new})
    torch.testing.assert_close(hooked, ref, **F64)
    plain, _ = timm_forward(state, args, _normalised(img))
    assert (hooked - plain).abs().max() > 1e-3


def test_hook_in_is_the_layernormed_input_and_head_out_what_the_projection_reads(tmp_path):
    args = dict(SMALL, reg_tokens=2, qk_norm=True)
    model, _ = load_checkpoint(write_timm_folder(tmp_path / "m", "vit_base_patch16_224", timm_state(args), args))
    model = model.double()
    img = torch.rand(2, 3, 28, 21, dtype=torch.float64)
    _, cache = run_with_cache(model, img)
    block = model.blocks[1]
    torch.testing.assert_close(cache["blocks.1.attn.hook_in"], block.norm1(cache["blocks.0.resid_post"]), **F64)
    head_out = cache["blocks.1.attn.head_out"]
    assert head_out.shape == (2, 3 + 12, 3, 8)
    q, k, v = block.attn.queries_keys_values(cache["blocks.1.attn.hook_in"])
    torch.testing.assert_close(head_out, (cache["blocks.1.attn.pattern"] @ v).transpose(1, 2), **F64)
    torch.testing.assert_close(
        block.attn.attention_matrix(cache["blocks.1.attn.hook_in"]), cache["blocks.1.attn.pattern"], **F64
    )
    assert model.config.attn == "dot" and model.blocks[0].attn.num_heads == 3 and model.grid_for(28, 21) == (4, 3)
    with pytest.raises(ValueError, match="multiple of the patch size 7"):
        model(torch.rand(1, 3, 30, 21))


def test_the_labs_attention_maps_read_a_standard_vit(tmp_path):
    """The analysis reads ``hook_in``, ``attention_matrix``, ``num_prefix_tokens`` and ``grid_for``: the same
    attributes as on the lab's ViT give the standard ViT's patch-to-patch attention and prefix share."""
    from ssog_core.analysis.measures import attention_maps

    args = dict(SMALL, reg_tokens=2)
    state = timm_state(args)
    model, _ = load_checkpoint(write_timm_folder(tmp_path / "m", "vit_base_patch16_224", state, args))
    img = torch.rand(2, 3, 49, 35, dtype=torch.float64)
    maps = attention_maps(model.double(), img)
    logits, attns = timm_forward(state, args, _normalised(img))
    assert maps.grid == (7, 5)
    torch.testing.assert_close(maps.logits, logits, **F64)
    for layer, a in enumerate(attns):
        rows = a[:, :, 3:]  # patch queries (class token and two registers first)
        torch.testing.assert_close(maps.prefix_share[layer], rows[..., :3].sum(-1), **F64)
        torch.testing.assert_close(maps.attn[layer], rows[..., 3:] / rows[..., 3:].sum(-1, keepdim=True), **F64)


# --- the lab's dot twin as a timm folder ---


def _lab_twin(**kwargs) -> ViT:
    """A dot-attention lab ViT on a 7×5 grid with small embeddings: the residual stream's variance is near the
    LayerNorm epsilons, so a conversion that ignored timm's 1e-6 against our 1e-5 would be far off."""
    torch.manual_seed(1)
    model = ViT(num_classes=6, img_size=(28, 20), patch_size=4, dim=24, depth=2, num_heads=3, attn="dot", **kwargs)
    _randomise(model).double()
    with torch.no_grad():
        for name in ("patch_embed.weight", "patch_embed.bias", "pos_embed", "registers"):
            if hasattr(model, name.split(".")[0]):
                model.get_parameter(name).mul_(0.01)
        for block in model.blocks:
            block.attn.out.weight.mul_(0.01)
            block.mlp[2].weight.mul_(0.01)
            block.mlp[2].bias.mul_(0.01)
    return model.eval()


@pytest.mark.parametrize("registers", [0, 2])
def test_lab_twin_as_timm_is_exact_in_float64(registers):
    lab = _lab_twin(num_registers=registers)
    std = timm_twin(lab)
    img = torch.rand(3, 3, 28, 20, dtype=torch.float64)
    torch.testing.assert_close(std(img), lab(img), rtol=1e-11, atol=1e-12)
    state = to_timm(std.state_dict(), 4, 3)
    assert state["patch_embed.proj.weight"].shape == (24, 3, 4, 4)
    args = dict(img_size=[28, 20], patch_size=4, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=6)
    args.update(class_token=False, global_pool="avg", fc_norm=False, qkv_bias=False, reg_tokens=registers)
    args.update(no_embed_class=True)
    ref, _ = timm_forward(state, args, img)
    torch.testing.assert_close(ref, lab(img), rtol=1e-11, atol=1e-12)
    for m in lab.modules():  # the epsilon matters here: the lab's own model with timm's epsilon is far off
        if isinstance(m, torch.nn.LayerNorm):
            m.eps = 1e-6
    assert (std(img) - lab(img)).abs().max() > 1e-3


@pytest.mark.parametrize("registers", [0, 2])
def test_convert_to_timm_writes_a_folder_the_lab_and_timm_agree_on(tmp_path, registers):
    lab = _lab_twin(num_registers=registers)
    ckpt = save_checkpoint(tmp_path / "lab.safetensors", lab.float(), {"class_names": list("abcdef")})
    assert convert_main(["--to", "timm", str(ckpt), str(tmp_path / "timm")]) == 0
    config = json.loads((tmp_path / "timm" / "config.json").read_text())
    margs = config["model_args"]
    assert (margs["class_token"], margs["global_pool"], margs["fc_norm"], margs["qkv_bias"]) == (
        False,
        "avg",
        False,
        False,
    )
    assert (
        margs["reg_tokens"] == registers and margs["img_size"] == [28, 20] and config["label_names"] == list("abcdef")
    )
    assert config["pretrained_cfg"]["mean"] == [0.0] * 3 and config["pretrained_cfg"]["std"] == [1.0] * 3
    state = weights(tmp_path / "timm" / "model.safetensors")
    assert all(not state[f"blocks.{i}.attn.proj.bias"].any() for i in range(2))
    lab64 = ViT(lab.config).double().eval()
    lab64.load_state_dict(load_checkpoint(ckpt)[0].state_dict())
    img = torch.rand(3, 3, 28, 20, dtype=torch.float64)
    ref, _ = timm_forward(state, margs, img)  # timm's forward of what was written (float32 weights)
    torch.testing.assert_close(ref, lab64(img), rtol=1e-5, atol=1e-6)
    back, meta = load_checkpoint(tmp_path / "timm")
    assert meta["class_names"] == list("abcdef")
    torch.testing.assert_close(back.double()(img), ref, **F64)


def test_convert_to_timm_refuses_what_timm_cannot_hold(tmp_path, capsys):
    ssog = save_checkpoint(
        tmp_path / "s.safetensors", ViT(num_classes=3, img_size=8, patch_size=4, dim=8, depth=1, num_heads=2)
    )
    assert convert_main(["--to", "timm", str(ssog), str(tmp_path / "o")]) == 2
    assert "only the lab's plain dot-attention ViT converts to timm (this one: attn='ssog')" in capsys.readouterr().err
    qk = save_checkpoint(
        tmp_path / "q.safetensors",
        ViT(num_classes=3, img_size=8, patch_size=4, dim=8, depth=1, num_heads=2, attn="dot", qk_norm=True),
    )
    assert convert_main(["--to", "timm", str(qk), str(tmp_path / "o")]) == 2
    assert "QK-norm" in capsys.readouterr().err
    assert convert_main(["--to", "timm", str(qk), "--config", "{}", str(tmp_path / "o")]) == 2
    assert "--config describes an upstream state dict" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert convert_main(["--to", "timm", str(qk), str(tmp_path / "file")]) == 2
    assert "is a file; --to timm writes a folder" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_old_standard_names_build_the_one_vit_with_a_deprecation_warning():
    from ssog_core.nn.config import standard_config
    from ssog_core.nn.standard_vit import StandardViT, StandardViTConfig

    with pytest.warns(DeprecationWarning, match="StandardViTConfig is deprecated"):
        cfg = StandardViTConfig(family="deit", img_size=(28, 20), patch_size=4, dim=12, depth=1, num_heads=3,
                                num_classes=5, mlp_hidden=24, proj_bias=False)  # fmt: skip
    assert cfg == standard_config("deit", img_size=(28, 20), patch_size=4, dim=12, depth=1, num_heads=3,
                                  num_classes=5, mlp_hidden=24, proj_bias=False, mlp_bias=False)  # fmt: skip
    with pytest.warns(DeprecationWarning, match="StandardViT is deprecated"):
        model = StandardViT(cfg)
    assert type(model) is ViT and model.config.family == "deit" and model.num_prefix_tokens == 1


def test_every_model_the_lab_opens_offers_what_the_protocol_declares(tmp_path):
    from ssog_core.nn.protocol import LabModel

    args = dict(SMALL, reg_tokens=2)
    folder, _ = load_checkpoint(write_timm_folder(tmp_path / "m", "vit_base_patch16_224", timm_state(args), args))
    lab = ViT(num_classes=3, img_size=(28, 20), patch_size=4, dim=12, depth=1, num_heads=3, attn="dot")
    for model, prefix, patch, normalization in ((folder, 3, 7, True), (lab, 0, 4, False)):
        assert isinstance(model, LabModel)
        assert model.num_prefix_tokens == prefix and model.patch_size == patch
        assert model.grid_for(4 * patch, 5 * patch) == (4, 5)
        assert (model.normalization is not None) == normalization
    assert folder.normalization == {"mean": MEAN, "std": STD} and folder.config.family == "timm"
    assert not isinstance(torch.nn.Linear(2, 2), LabModel)

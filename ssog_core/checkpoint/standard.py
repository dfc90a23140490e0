"""Open standard ViTs as the lab's one :class:`~ssog_core.nn.vit.ViT`: folders in timm's Hugging Face layout or in
transformers' (ViT, DeiT, DINOv2, DINOv2 with registers), or ``hf-hub:ORG/NAME`` from the local Hugging Face cache;
and write a lab model as a timm folder (``python -m ssog_core convert --to timm``).

Each family is a reader (its config → a :class:`~ssog_core.nn.config.ViTConfig` with the family's conventions) and a
converter (its tensor names → the model's): ``_timm_config`` / ``_from_timm`` and ``_hf_config`` / ``_from_hf``.

Nothing is downloaded and nothing is unpickled: weights come from ``model.safetensors`` (``pytorch_model.bin`` only
through ``torch.load(weights_only=True)``). A timm folder's ``config.json`` names an ``architecture`` whose sizes come
from the table below or from ``model_args`` (unknown keys refused by name); a transformers folder's names its
``model_type`` and its ``preprocessor_config.json`` the image mean and std. Anything else is refused with a sentence
naming what is supported, and weights that do not fit the architecture with every mismatch in one message.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ssog_core.checkpoint.files import atomic_write
from ssog_core.checkpoint.weights import (
    MAX_CHECKPOINT_BYTES,
    CheckpointError,
    load_weights,
    read_safetensors,
    read_weights_only,
    write_safetensors,
)
from ssog_core.nn.config import LAB_EPS, TIMM_EPS, ViTConfig, standard_config
from ssog_core.nn.vit import ViT

HUB_PREFIX = "hf-hub:"
MAX_PARAMETERS = MAX_CHECKPOINT_BYTES // 4  # as many float32 weights as the largest checkpoint file the lab reads
SUPPORTED = (
    "timm's VisionTransformer (vit_{tiny,small,base,large,huge}_patch{8,14,16,32}_*, the *_gap_* and *_reg*_gap_* "
    "variants, vit_*_patch14_dinov2, vit_*_patch14_reg4_dinov2, deit_*, deit3_*) and transformers' model types "
    "vit, deit, dinov2 and dinov2_with_registers"
)

# --- timm: architecture names → VisionTransformer arguments (from timm's model definitions) ---

_SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "medium": (512, 12, 8),
    "betwixt": (640, 12, 10),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}
_SIZE_KEYS = {"patch_size", "embed_dim", "depth", "num_heads"}  # what model_args must give for a name not in the table
_GAP = dict(class_token=False, global_pool="avg")
_REG_GAP = dict(_GAP, no_embed_class=True)
_TIMM_FAMILIES: tuple[tuple[str, dict[str, Any]], ...] = (  # (name pattern, arguments beyond the size's)
    (r"vit_(tiny|small|base|large|huge)_patch(8|14|16|32)_(\d+)", {}),
    (r"vit_(small|base|large)_patch(14)_dinov2", dict(init_values=1e-5, img_size=518)),
    (
        r"vit_(small|base|large)_patch(14)_reg4_dinov2",
        dict(init_values=1e-5, reg_tokens=4, no_embed_class=True, img_size=518),
    ),
    (r"deit_(tiny|small|base)_patch(16)_(224|384)", {}),
    (r"deit_(tiny|small|base)_distilled_patch(16)_(224|384)", dict(distilled=True)),
    (r"deit3_(small|medium|base|large)_patch(16)_(224|384)", dict(no_embed_class=True, init_values=1e-6)),
    (r"deit3_(huge)_patch(14)_(224)", dict(no_embed_class=True, init_values=1e-6)),
    (r"vit_(medium|betwixt)_patch(16)_gap_(240|256|384)", dict(_GAP, qkv_bias=False, init_values=1e-6, fc_norm=False)),
    (r"vit_(base)_patch(16)_gap_(224)", dict(_GAP, num_heads=16, fc_norm=False)),
    (r"vit_(medium|betwixt)_patch(16)_reg(1|4)_gap_(256|384)", dict(_REG_GAP, init_values=1e-5)),
    (r"vit_(mediumd)_patch(16)_reg(4)_gap_(256|384)", dict(_REG_GAP, init_values=1e-5, depth=20)),
    (r"vit_(base)_patch(16)_reg(4)_gap_(256)", _REG_GAP),
)
# VisionTransformer's arguments: those a timm folder may set, and the values this model supports where limited.
_TIMM_DEFAULTS: dict[str, Any] = dict(
    img_size=224, patch_size=16, in_chans=3, num_classes=1000, global_pool="token", embed_dim=768, depth=12,
    num_heads=12, mlp_ratio=4.0, qkv_bias=True, qk_norm=False, proj_bias=True, init_values=None, class_token=True,
    no_embed_class=False, reg_tokens=0, fc_norm=None, dynamic_img_size=False, drop_rate=0.0, pos_drop_rate=0.0,
    patch_drop_rate=0.0, proj_drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0, weight_init="", fix_init=False,
)  # fmt: skip
_TIMM_ONLY = dict(  # argument → the values supported (the others change the architecture)
    pos_embed=("learn",), pre_norm=(False,), final_norm=(True,), pool_include_prefix=(False,),
    dynamic_img_pad=(False,), scale_attn_norm=(False,), scale_mlp_norm=(False,), act_layer=(None, "gelu"),
    norm_layer=(None, "layernorm"), embed_norm_layer=(None,), attn_layer=("", "attn"),
)  # fmt: skip


def _timm_arch_args(name: str) -> dict[str, Any] | None:
    """VisionTransformer arguments of a timm architecture name (its pretrained tag dropped), or None."""
    name = name.split(".")[0]
    for pattern, extra in _TIMM_FAMILIES:
        found = re.fullmatch(pattern, name)
        if found:
            dim, depth, heads = _SIZES[found.group(1).rstrip("d")]
            args = dict(embed_dim=dim, depth=depth, num_heads=heads, patch_size=int(found.group(2)))
            if found.lastindex and found.lastindex >= 3 and "img_size" not in extra:
                args["img_size"] = int(found.group(found.lastindex))
            if "reg" in pattern and "gap" in pattern:
                args["reg_tokens"] = int(found.group(3))
            return {**args, **extra}
    return None


def _timm_config(cfg: Mapping[str, Any], name: str) -> tuple[ViTConfig, list[str] | None]:
    """The model a timm ``config.json`` describes, and its label names if it has any."""
    if "pretrained_cfg" in cfg:
        pretrained = dict(cfg["pretrained_cfg"] or {})
    else:  # timm's older single-dict layout
        pretrained = {k: v for k, v in cfg.items() if k not in ("architecture", "num_features")}
    for key in ("num_classes", "label_names"):
        if key in cfg:
            pretrained[key] = cfg[key]
    arch = cfg["architecture"]
    model_args = cfg.get("model_args") or {}
    if not isinstance(arch, str) or not isinstance(model_args, dict) or not isinstance(pretrained, dict):
        raise CheckpointError(f"{name}: architecture must be a name, model_args and pretrained_cfg JSON objects")
    known = set(_TIMM_DEFAULTS) | set(_TIMM_ONLY)
    unknown = sorted(set(model_args) - known)
    if unknown:
        raise CheckpointError(
            f"{name}: unknown model_args key(s) {', '.join(unknown)} (a standard ViT takes {', '.join(sorted(known))})"
        )
    base = _timm_arch_args(arch)
    if base is None and not (arch.split("_")[0] in ("vit", "deit", "deit3") and set(model_args) >= _SIZE_KEYS):
        raise CheckpointError(
            f"{name}: {arch!r} is not an architecture SSOG Lab opens: it supports {SUPPORTED}; windowed or "
            "relative-position attention (Swin, BEiT, EVA, ...) and other families are not supported"
        )
    args = dict(model_args)  # timm: the folder's model_args, then the pretrained config's defaults, then the name's
    input_size = pretrained.get("input_size")
    if isinstance(input_size, list) and len(input_size) == 3:
        args.setdefault("in_chans", input_size[0])
        if pretrained.get("fixed_input_size", False):
            args.setdefault("img_size", input_size[1:])
    if isinstance(pretrained.get("num_classes"), int) and pretrained["num_classes"] >= 0:
        args.setdefault("num_classes", pretrained["num_classes"])
    if pretrained.get("global_pool"):
        args.setdefault("global_pool", pretrained["global_pool"])
    distilled = bool((base or {}).pop("distilled", False))
    args = {**_TIMM_DEFAULTS, **(base or {}), **args}
    limited = [f"{k}={args[k]!r} (supported: {v})" for k, v in _TIMM_ONLY.items() if k in args and args[k] not in v]
    if args["global_pool"] not in ("token", "avg"):
        limited.append(f"global_pool={args['global_pool']!r} (supported: 'token', 'avg')")
    if limited:
        raise CheckpointError(f"{name}: {arch} is not a standard ViT this lab runs: " + "; ".join(limited))
    whole = ("patch_size", "embed_dim", "depth", "num_heads", "num_classes", "in_chans", "reg_tokens")
    bad = [k for k in whole if not isinstance(args[k], int) or isinstance(args[k], bool)]
    if bad:
        raise CheckpointError(f"{name}: {', '.join(f'{k}={args[k]!r}' for k in bad)} must be whole numbers")
    mean, std = pretrained.get("mean"), pretrained.get("std")
    if mean is None or std is None:
        raise CheckpointError(f"{name}: pretrained_cfg gives no mean and std, so the model's input is not known")
    dim, prefix = args["embed_dim"], int(bool(args["class_token"])) + int(distilled) + args["reg_tokens"]
    try:
        config = standard_config(
            "timm",
            img_size=args["img_size"] if isinstance(args["img_size"], int) else tuple(args["img_size"]),
            patch_size=args["patch_size"],
            dim=dim,
            depth=args["depth"],
            num_heads=args["num_heads"],
            num_classes=args["num_classes"],
            mlp_ratio=float(args["mlp_ratio"]),
            mlp_hidden=int(dim * args["mlp_ratio"]),
            in_chans=args["in_chans"],
            eps=TIMM_EPS,
            qkv_bias=bool(args["qkv_bias"]),
            proj_bias=bool(args["proj_bias"]),
            mlp_bias=bool(args["proj_bias"]),
            qk_norm=bool(args["qk_norm"]),
            layer_scale=bool(args["init_values"]),
            class_token=bool(args["class_token"]),
            dist_token=distilled,
            num_registers=args["reg_tokens"],
            pos_prefix=0 if args["no_embed_class"] else prefix,
            pool=args["global_pool"],
            fc_norm=args["global_pool"] == "avg" if args["fc_norm"] is None else bool(args["fc_norm"]),
            distilled=distilled,
            mean=tuple(mean),
            std=tuple(std),
        )
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{name}: {e}") from None
    labels = pretrained.get("label_names")
    if isinstance(labels, dict):
        labels = [labels.get(str(i), labels.get(i, str(i))) for i in range(config.num_classes)]
    return config, labels


_TIMM_NAMES = (  # (timm's, the model's) name parts; every other name is the same in both
    ("patch_embed.proj.", "patch_embed."),
    ("reg_token", "registers"),
    ("attn.proj.", "attn.out."),
    ("mlp.fc1.", "mlp.0."),
    ("mlp.fc2.", "mlp.2."),
)


def _renamed(key: str, pairs: tuple[tuple[str, str], ...]) -> str:
    """``key`` with the first of ``pairs`` that names one of its parts replaced."""
    for old, new in pairs:
        if key.startswith(old) or f".{old}" in key:
            return key.replace(old, new, 1)
    return key


def _from_timm(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """timm's tensors under the model's names; the patch convolution's weight flattened to a linear map's, whose
    input is the patch in (channel, row, column) order (``patch_order="chw"``)."""
    out = {_renamed(k, _TIMM_NAMES): t for k, t in state.items()}
    w = out.get("patch_embed.weight")
    if w is not None and w.dim() == 4:
        out["patch_embed.weight"] = w.flatten(1)
    return out


def to_timm(state: Mapping[str, Tensor], patch: int, in_chans: int) -> dict[str, Tensor]:
    """A standard model's tensors under timm's names, the patch embedding as timm's convolution weight: what
    :func:`_from_timm` reads back."""
    out = {_renamed(k, tuple((b, a) for a, b in _TIMM_NAMES)): t for k, t in state.items()}
    out["patch_embed.proj.weight"] = out["patch_embed.proj.weight"].reshape(-1, in_chans, patch, patch)
    return out


# --- transformers: model types and their layouts (the names save_pretrained writes) ---

_HF_TYPES = ("vit", "deit", "dinov2", "dinov2_with_registers")
_HF_HEADS = {  # architecture → (pool, distilled, classifier names)
    "ViTForImageClassification": ("token", False, {"classifier": "head"}),
    "DeiTForImageClassification": ("token", False, {"classifier": "head"}),
    "DeiTForImageClassificationWithTeacher": (
        "token",
        True,
        {"cls_classifier": "head", "distillation_classifier": "head_dist"},
    ),
    "Dinov2ForImageClassification": ("token+avg", False, {"classifier": "head"}),
    "Dinov2WithRegistersForImageClassification": ("token+avg", False, {"classifier": "head"}),
    "ViTModel": ("token", False, {}),
    "DeiTModel": ("token", False, {}),
    "Dinov2Model": ("token", False, {}),
    "Dinov2WithRegistersModel": ("token", False, {}),
}
_HF_LAYER = {  # a layer's module names in transformers → the model's
    "layernorm_before": "norm1",
    "layernorm_after": "norm2",
    "intermediate.dense": "mlp.fc1",
    "output.dense": "mlp.fc2",
    "norm1": "norm1",
    "norm2": "norm2",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
    "attention.output.dense": "attn.proj",
    "layer_scale1.lambda1": "ls1.gamma",
    "layer_scale2.lambda1": "ls2.gamma",
}
_HF_EMBED = {
    "cls_token": "cls_token",
    "distillation_token": "dist_token",
    "register_tokens": "reg_token",
    "position_embeddings": "pos_embed",
    "patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "patch_embeddings.projection.bias": "patch_embed.proj.bias",
}


def _hf_config(cfg: Mapping[str, Any], folder: Path, name: str) -> tuple[ViTConfig, list[str] | None, dict]:
    """The model a transformers ``config.json`` (and ``preprocessor_config.json``) describes, its label names, and
    the classifier renaming of its architecture."""
    kind = cfg["model_type"]
    if kind not in _HF_TYPES:
        raise CheckpointError(f"{name}: model_type {kind!r} is not supported: SSOG Lab opens {SUPPORTED}")
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    if arch not in _HF_HEADS:
        raise CheckpointError(f"{name}: architecture {arch!r} is not one SSOG Lab opens ({', '.join(_HF_HEADS)})")
    pool, distilled, heads = _HF_HEADS[arch]
    whole = ("hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size", "num_channels")
    whole += ("intermediate_size", "num_register_tokens")
    bad = [k for k in whole if k in cfg and (not isinstance(cfg[k], int) or isinstance(cfg[k], bool))]
    if bad:
        raise CheckpointError(f"{name}: {', '.join(f'{k}={cfg[k]!r}' for k in bad)} must be whole numbers")
    problems = []
    if cfg.get("hidden_act", "gelu") != "gelu":
        problems.append(f"hidden_act={cfg['hidden_act']!r} (supported: 'gelu')")
    if cfg.get("use_swiglu_ffn"):
        problems.append("use_swiglu_ffn=true (a SwiGLU MLP; supported: the GELU MLP)")
    dim, heads_n = cfg.get("hidden_size", 768), cfg.get("num_attention_heads", 12)
    if cfg.get("head_dim") not in (None, dim // max(heads_n, 1)):
        problems.append(f"head_dim={cfg['head_dim']} (supported: hidden_size / num_attention_heads)")
    if problems:
        raise CheckpointError(f"{name}: not a standard ViT this lab runs: " + "; ".join(problems))
    pre_path = folder / "preprocessor_config.json"
    if not pre_path.is_file():
        raise CheckpointError(f"{folder.name} has no preprocessor_config.json, so the image mean and std are not known")
    pre = _read_json(pre_path)
    rescale = pre.get("rescale_factor", 1 / 255) if pre.get("do_rescale", True) else None
    if not isinstance(rescale, (int, float)) or not math.isclose(rescale, 1 / 255):
        raise CheckpointError(f"{pre_path.name}: the model expects pixels rescaled by 1/255; this one does not say so")
    channels = cfg.get("num_channels", 3)
    mean, std = (pre.get("image_mean"), pre.get("image_std")) if pre.get("do_normalize", True) else (None, None)
    mean, std = mean or [0.0] * channels, std or [1.0] * channels
    labels = None
    id2label = cfg.get("id2label") or {}
    n = len(id2label) if arch.endswith(("Classification", "WithTeacher")) else 0
    if n and any(id2label.get(str(i)) != f"LABEL_{i}" for i in range(n)):
        labels = [str(id2label.get(str(i), i)) for i in range(n)]
    mlp = cfg.get("intermediate_size") if kind in ("vit", "deit") else int(dim * cfg.get("mlp_ratio", 4))
    try:
        config = standard_config(
            kind,
            img_size=cfg.get("image_size", 224)
            if isinstance(cfg.get("image_size", 224), int)
            else tuple(cfg["image_size"]),
            patch_size=cfg.get("patch_size", 16),
            dim=dim,
            depth=cfg.get("num_hidden_layers", 12),
            num_heads=heads_n,
            num_classes=n,
            mlp_ratio=(mlp if mlp is not None else 3072) / dim,
            mlp_hidden=mlp if mlp is not None else 3072,
            in_chans=channels,
            eps=float(cfg.get("layer_norm_eps", 1e-12 if kind in ("vit", "deit") else 1e-6)),
            qkv_bias=bool(cfg.get("qkv_bias", True)),
            class_token=True,
            layer_scale=kind.startswith("dinov2"),
            dist_token=kind == "deit",
            num_registers=cfg.get("num_register_tokens", 0) if kind == "dinov2_with_registers" else 0,
            pos_prefix=2 if kind == "deit" else 1,
            pool=pool,
            distilled=distilled,
            resize_antialias=kind == "dinov2_with_registers",
            resize_in_float32=kind.startswith("dinov2"),
            mean=tuple(mean),
            std=tuple(std),
        )
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{name}: {e}") from None
    return config, labels, heads


def _from_hf(state: dict[str, Tensor], kind: str, heads: Mapping[str, str]) -> dict[str, Tensor]:
    """transformers' names → the model's (q, k and v joined into one qkv); a name it does not know is kept as it
    is, so the fit check reports it."""
    out: dict[str, Tensor] = {}
    qkv: dict[tuple[str, str], dict[str, Tensor]] = {}
    for key, t in state.items():
        name = key[len(kind) + 1 :] if key.startswith(kind + ".") else key
        if name.startswith("pooler.") or name == "embeddings.mask_token":
            continue  # the base model's pooler and the masked-modelling token: not part of classification
        layer = re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|lambda1)", name)
        if name.startswith("embeddings.") and name[11:] in _HF_EMBED:
            out[_HF_EMBED[name[11:]]] = t
        elif name == "layernorm.weight" or name == "layernorm.bias":
            out["norm." + name.split(".")[1]] = t
        elif name.split(".")[0] in heads and name.count(".") == 1:
            out[heads[name.split(".")[0]] + "." + name.split(".")[1]] = t
        elif layer and layer.group(2).startswith("attention.attention."):
            qkv.setdefault((layer.group(1), layer.group(3)), {})[layer.group(2).rsplit(".", 1)[1]] = t
        elif layer and f"{layer.group(2)}.{layer.group(3)}" in _HF_LAYER:
            out[f"blocks.{layer.group(1)}.{_HF_LAYER[layer.group(2) + '.' + layer.group(3)]}"] = t
        elif layer and layer.group(2) in _HF_LAYER:
            out[f"blocks.{layer.group(1)}.{_HF_LAYER[layer.group(2)]}.{layer.group(3)}"] = t
        else:
            out[key] = t
    for (i, part), parts in qkv.items():
        if set(parts) == {"query", "key", "value"} and len({p.shape for p in parts.values()}) == 1:
            out[f"blocks.{i}.attn.qkv.{part}"] = torch.cat([parts["query"], parts["key"], parts["value"]])
        else:  # incomplete or mis-shaped: reported under transformers' names
            out.update({f"{kind}.encoder.layer.{i}.attention.attention.{p}.{part}": t for p, t in parts.items()})
    return _from_timm(out)  # the patch convolution's weight, as for timm


# --- folders, the hub cache, weights, building ---


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path.name} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path.name} holds {type(data).__name__}, not a JSON object")
    return data


def hub_cache() -> Path:
    """The Hugging Face cache folder, as huggingface_hub finds it (its environment variables, then the default)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface" / "hub"


def is_standard_source(source: str | Path) -> bool:
    """Whether ``source`` names a standard ViT (a timm or transformers model folder, or ``hf-hub:ORG/NAME``) rather
    than an SSOG Lab checkpoint file."""
    return str(source).startswith(HUB_PREFIX) or Path(source).is_dir()


def resolve(source: str | Path) -> Path:
    """The folder ``source`` names: itself, or for ``hf-hub:ORG/NAME[@REVISION]`` its snapshot in the local cache
    (offline: a repository not there is refused with the folder it would be in)."""
    text = str(source)
    if not text.startswith(HUB_PREFIX):
        return Path(source)
    repo, _, revision = text[len(HUB_PREFIX) :].partition("@")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo) or ".." in repo:
        raise CheckpointError(f"{text!r} is not {HUB_PREFIX}ORG/NAME")
    if revision and (not re.fullmatch(r"[\w.-]+", revision) or revision.strip(".") == ""):
        raise CheckpointError(f"{text!r}: a revision is a branch, tag or commit name (letters, digits, - _ .)")
    root = hub_cache() / f"models--{repo.replace('/', '--')}"
    revision = revision or "main"
    ref = root / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    folder = root / "snapshots" / commit
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{text} is not in the local Hugging Face cache (no {folder}/config.json); SSOG Lab does not download: "
            f"fetch it where there is a network (`hf download {repo}`), or point at a folder holding its config.json "
            "and model.safetensors"
        )
    return folder


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The tensors of ``model.safetensors``, else of ``pytorch_model.bin`` read with ``weights_only=True``."""
    if (folder / "model.safetensors").is_file():
        return read_safetensors(folder / "model.safetensors")[1]
    if (folder / "pytorch_model.bin").is_file():
        return read_weights_only(folder / "pytorch_model.bin")
    sharded = any(folder.glob("*.index.json"))
    raise CheckpointError(
        f"{folder.name} holds {'sharded weights' if sharded else 'no weights'}: SSOG Lab reads model.safetensors "
        "(or pytorch_model.bin, tensors only)"
    )


def parameter_count(config: ViTConfig) -> int:
    """Parameters of the model ``config`` describes, counted without allocating (on the meta device, one block)."""
    with torch.device("meta"):
        one = ViT(replace(config, depth=1))
    per_block = sum(p.numel() for p in one.blocks[0].parameters())
    return sum(p.numel() for p in one.parameters()) + (config.depth - 1) * per_block


def check_size(config: ViTConfig, source: str) -> None:
    """Refuse a config naming more parameters than the lab opens, before reading or allocating anything."""
    try:
        n = parameter_count(config)
    except (RuntimeError, TypeError, OverflowError) as e:  # sizes past what torch can even describe
        raise CheckpointError(f"{source} describes a model too large to build: {str(e).splitlines()[0]}") from None
    if n > MAX_PARAMETERS:
        raise CheckpointError(f"{source} describes {n:,} parameters, over the {MAX_PARAMETERS:,} SSOG Lab opens")


def build_standard(config: ViTConfig, state: Mapping[str, Tensor], source: str) -> ViT:
    """A float32 eval-mode model holding ``state``, after checking that every tensor fits."""
    layers = {k.split(".")[1] for k in state if k.startswith("blocks.") and k.count(".") > 1}
    if len(layers) != config.depth:  # before building: a claimed depth the weights do not have
        raise CheckpointError(f"{source}: the config says {config.depth} layers, the weights hold {len(layers)}")
    with torch.device("meta"):
        model = ViT(config)
    return load_weights(model, state, source, f"{config.family} ViT")


@cache
def imagenet_classes() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """ImageNet-1k's WordNet ids and names, in the order every 1000-class head uses."""
    rows = [line.split("\t") for line in (Path(__file__).parent / "imagenet1k.tsv").read_text().splitlines()]
    return tuple(r[0] for r in rows), tuple(r[1] for r in rows)


def class_names(labels: list[str] | None, num_classes: int) -> list[str]:
    """The config's label names (ImageNet ids turned into names), else ImageNet-1k's for 1000 classes, else
    the indices."""
    ids, names = imagenet_classes()
    if labels and len(labels) == num_classes:
        return list(names) if tuple(labels) == ids else [str(x) for x in labels]
    return list(names) if num_classes == 1000 else [str(i) for i in range(num_classes)]


def folder_config(source: str | Path) -> tuple[ViTConfig, dict[str, Any]]:
    """The model a folder (or ``hf-hub:ORG/NAME``) describes, from its JSON files alone (no weights read), and
    ``layout`` (timm or transformers), ``architecture``, ``labels``: enough to name it in a picker."""
    folder = resolve(source)
    config, labels, _, kind, arch = _folder_config(folder)
    return config, {"layout": kind, "architecture": arch, "labels": labels}


def _folder_config(folder: Path) -> tuple[ViTConfig, list[str] | None, Callable, str, str]:
    """Config, label names, weight renaming, layout and architecture of a model folder (refused in words)."""
    if not (folder / "config.json").is_file():
        raise CheckpointError(
            f"{folder.name} is not a model folder (no config.json): SSOG Lab opens an SSOG Lab checkpoint file, "
            f"or a folder of {SUPPORTED}"
        )
    cfg = _read_json(folder / "config.json")
    name = f"{folder.name}/config.json"
    convert: Callable[[dict[str, Tensor]], dict[str, Tensor]]
    if "architecture" in cfg:
        config, labels = _timm_config(cfg, name)
        convert, kind = _from_timm, "timm"
    elif "model_type" in cfg:
        config, labels, heads = _hf_config(cfg, folder, name)
        convert, kind = (lambda s: _from_hf(s, config.family, heads)), "transformers"
    else:
        raise CheckpointError(f"{name} names neither a timm architecture nor a transformers model_type: {SUPPORTED}")
    check_size(config, name)
    return config, labels, convert, kind, str(cfg.get("architecture", config.family))


def load_standard(source: str | Path, device: str | torch.device = "cpu") -> tuple[ViT, dict[str, Any]]:
    """A timm or transformers folder (or ``hf-hub:ORG/NAME``) as an eval-mode float32 model and its metadata
    (``class_names``; ``normalization`` None: the model applies its own mean and std)."""
    folder = resolve(source)
    config, labels, convert, kind, arch = _folder_config(folder)
    model = build_standard(config, convert(read_weights(folder)), folder.name).to(device)
    meta = {
        "class_names": class_names(labels, config.num_classes),
        "normalization": None,
        "config": config.to_dict(),
        "source": {"layout": kind, "path": str(source), "architecture": arch},
    }
    return model, meta


# --- writing: the lab's dot model as a timm folder ---


def timm_twin(model: torch.nn.Module) -> ViT:
    """The lab's dot-attention ViT as the same function in timm's conventions (float64 arithmetic).

    timm's LayerNorm epsilon is 1e-6, ours 1e-5. ``LN(a·x)`` with epsilon ``ε'`` is ``LN(x)`` with ``ε'/a²``, so the
    residual stream is scaled by ``a = √(1e-6 / 1e-5)``: the embeddings and the outputs of both residual branches
    (attention projection, second MLP layer) are multiplied by ``a``; every LayerNorm then sees ``a·x`` and gives
    exactly what ours gave. The patch embedding's input order becomes a convolution's (channel, row, column); the
    lab's attention has no biases (zero projection biases here) and takes [0, 1] pixels (mean 0, std 1)."""
    cfg = model.config
    if cfg.family != "lab" or cfg.attn != "dot" or cfg.qk_norm or cfg.susie:
        raise CheckpointError(
            f"only the lab's plain dot-attention ViT converts to timm (this one: attn={cfg.attn!r}"
            f"{', QK-norm (RMS, no gain; timm uses LayerNorm)' if cfg.qk_norm else ''}"
            f"{', SuSiE position code' if cfg.susie else ''}"
            f"{f', a {cfg.family} model' if cfg.family != 'lab' else ''})"
        )
    a = math.sqrt(TIMM_EPS / LAB_EPS)
    p, c, dim = cfg.patch_size, cfg.in_chans, cfg.dim
    config = standard_config(
        "timm", img_size=cfg.img_size, patch_size=p, dim=dim, depth=cfg.depth, num_heads=cfg.num_heads,
        num_classes=cfg.num_classes, mlp_ratio=cfg.mlp_ratio, mlp_hidden=cfg.mlp_width, in_chans=c, qkv_bias=False,
        class_token=False, num_registers=cfg.num_registers, pos_prefix=0, pool="avg", fc_norm=False,
        mean=(0.0,) * c, std=(1.0,) * c,
    )  # fmt: skip
    state = {k: v.detach().double() for k, v in model.state_dict().items()}
    w = state["patch_embed.weight"].view(dim, p, p, c).permute(0, 3, 1, 2).reshape(dim, -1)  # (row, col, ch) → conv's
    state["patch_embed.weight"] = w
    scaled = ["patch_embed.weight", "patch_embed.bias", "pos_embed"] + ["registers"] * bool(cfg.num_registers)
    for i in range(cfg.depth):
        b = f"blocks.{i}."
        scaled += [b + "attn.out.weight", b + "mlp.2.weight", b + "mlp.2.bias"]
        state[b + "attn.out.bias"] = torch.zeros(dim, dtype=torch.float64)
    for k in scaled:
        state[k] = a * state[k]
    out = ViT(config).double()
    out.load_state_dict(state)
    return out.eval()


def timm_folder_config(config: ViTConfig, labels: list[str] | None) -> dict[str, Any]:
    """timm's ``config.json`` for a model timm's VisionTransformer represents (every argument in ``model_args``)."""
    problems = []
    if config.attn != "dot" or config.qk_norm_kind != "layernorm" or config.patch_order != "chw":
        problems.append("attention other than timm's dot-product, or a lab patch order")
    if config.mlp_bias != config.proj_bias:
        problems.append("biases on the MLP but not on the attention's projection, or the other way round")
    if config.eps != TIMM_EPS:
        problems.append(f"LayerNorm epsilon {config.eps} (timm's is {TIMM_EPS})")
    if config.distilled or config.dist_token or config.pool not in ("token", "avg"):
        problems.append("a distillation token or a class-token-and-mean head")
    if config.pos_prefix not in (0, config.num_prefix_tokens):
        problems.append("a position embedding over some of the prefix tokens only")
    ratio = config.mlp_width / config.dim
    if int(config.dim * ratio) != config.mlp_width:
        problems.append(f"an MLP width {config.mlp_width} that dim × mlp_ratio does not give")
    if problems:
        raise CheckpointError("timm's VisionTransformer cannot hold this model: " + "; ".join(problems))
    h, w = config.img_size
    model_args = dict(
        img_size=[h, w], patch_size=config.patch_size, in_chans=config.in_chans, num_classes=config.num_classes,
        global_pool=config.pool, embed_dim=config.dim, depth=config.depth, num_heads=config.num_heads,
        mlp_ratio=ratio, qkv_bias=config.qkv_bias, qk_norm=config.qk_norm, proj_bias=config.proj_bias,
        init_values=1.0 if config.layer_scale else None, class_token=config.class_token,
        no_embed_class=config.pos_prefix == 0, reg_tokens=config.num_registers, fc_norm=config.fc_norm,
    )  # fmt: skip
    pretrained = dict(
        input_size=[config.in_chans, h, w], fixed_input_size=True, interpolation="bicubic", crop_pct=1.0,
        crop_mode="center", mean=list(config.mean), std=list(config.std), num_classes=config.num_classes,
        first_conv="patch_embed.proj", classifier="head",
    )  # fmt: skip
    out = {"architecture": "vit_base_patch16_224", "num_classes": config.num_classes, "num_features": config.dim}
    out.update(global_pool=config.pool, model_args=model_args, pretrained_cfg=pretrained)
    if labels:
        out["label_names"] = list(labels)
    return out


def save_timm_folder(model: ViT, folder: str | Path, labels: list[str] | None = None) -> Path:
    """Write ``model`` as a timm folder (``model.safetensors``, then ``config.json``: each atomically, the config
    last, so a folder with a config always has its weights)."""
    folder = Path(folder)
    config = timm_folder_config(model.config, labels)
    state = {k: v.detach().float().cpu() for k, v in model.state_dict().items()}
    state = {k: v.contiguous() for k, v in to_timm(state, model.config.patch_size, model.config.in_chans).items()}
    write_safetensors(folder / "model.safetensors", state, {"format": "pt"})
    atomic_write(folder / "config.json", lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))
    return folder

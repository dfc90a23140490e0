"""The student: a dot-attention teacher's ViT with each head's patch-to-patch attention replaced by its fitted SSOG
field, which content may steer (docs/DESIGN.md §2.5).

Everything but the attention's scores is the teacher's: patch embedding, position embedding, prefix tokens, norms,
MLPs, the value and output projections, the head. Per layer the student's :class:`~ssog_core.nn.attention.
SSOGAttention` holds the head's K-atom fit (:func:`~ssog_core.analysis.head_as_field.fit_atoms`, τ = 1) as its fixed
field, steering probes at zero and gates cold (content steers nothing at step 0), and, with prefix tokens
(``prefix_dot``), the teacher's query and key projections for the prefix queries and each patch query's mean mass on
each prefix key as its content-blind prefix mass.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ssog_core.analysis.head_as_field import AtomFit, MeanAttention
from ssog_core.field import EPS, TAPS, TAU_MIN, softplus_inverse
from ssog_core.nn.config import ViTConfig
from ssog_core.nn.vit import ViT
from ssog_core.train.optim import FIELD_PARAMETERS

STUDENT_SIGMA_FLOOR = 0.0  # σ = softplus(raw) + 1e-4: every fitted σ (≥ 0.05 cells) is admitted as it is
MIN_PREFIX_MASS = 1e-6  # a prefix mass the teacher never gave stays a finite logit


class DistillError(ValueError):
    """A teacher, pictures or recipe distillation cannot take, said in words."""


def check_teacher(model: nn.Module, source: str) -> ViT:
    """``model`` if it is a ViT whose every head scores content by a plain dot product (what a field replaces);
    a :class:`DistillError` naming what is wrong otherwise."""
    cfg = getattr(model, "config", None)
    if not isinstance(model, ViT) or not isinstance(cfg, ViTConfig):
        raise DistillError(f"the teacher {source} is not a ViT the lab opens (an image classifier with attention)")
    if cfg.attn != "dot":
        raise DistillError(
            f"the teacher {source} has {cfg.attn} attention; distillation turns dot-product heads into SSOG fields "
            "(an SSOG model already is one, an RBF model's heads score distance)"
        )
    if cfg.qk_norm or cfg.susie:
        raise DistillError(
            f"the teacher {source} uses {'QK-norm' if cfg.qk_norm else 'SuSiE position codes'}: distillation takes "
            "dot-product heads without them"
        )
    if not cfg.num_classes:
        raise DistillError(f"the teacher {source} has no classifier head: distillation matches the teacher's logits")
    return model


def student_config(teacher: ViTConfig, atoms: int, steer: tuple[str, ...], max_offset: float) -> ViTConfig:
    """The teacher's config with SSOG attention: ``atoms`` factorized atoms per head, the taps ``steer``, cold gates,
    the student's σ floor, and prefix tokens kept by ``prefix_dot``."""
    unknown = [t for t in steer if t not in TAPS]
    if unknown or not steer or len(set(steer)) != len(steer):
        raise DistillError(f"--steer takes distinct taps from {', '.join(TAPS)} (e.g. mu or mu,sigma,lambda)")
    try:
        return teacher.replace(
            attn="ssog",
            num_atoms=atoms,
            field="factorized",
            steer=tuple(t for t in TAPS if t in steer),
            max_offset=max_offset,
            sigma_floor=STUDENT_SIGMA_FLOOR,
            cold_init=True,
            prefix_dot=teacher.num_prefix_tokens > 0,
        )
    except ValueError as e:
        raise DistillError(f"the student cannot be built: {e}") from None


def field_parameters(fit: AtomFit, floor: float) -> dict[str, Tensor]:
    """An SSOG layer's raw fixed-field parameters whose field is ``fit`` (τ = 1), float64."""
    sigma = fit.sigma.double() - EPS - floor
    if bool((sigma <= 0).any()):
        raise DistillError(f"a fitted σ below the student's floor {floor + EPS} cells")
    return {
        "mu": fit.mu.double(),
        "raw_sigma": softplus_inverse(sigma),
        "log_lambda": fit.lam.double().clamp_min(1e-300).log(),
        "raw_temperature": softplus_inverse(torch.tensor(1.0 - TAU_MIN, dtype=torch.float64)),
    }


def prefix_logits(attention: MeanAttention) -> Tensor:
    """``(H, P)`` logits (against the field's 0) whose softmax gives each prefix key the teacher's mean mass from
    patch queries (over queries and pictures) and the field the rest."""
    mass = attention.prefix_mass.double().mean(1).clamp_min(MIN_PREFIX_MASS)  # (H, P)
    rest = (1.0 - mass.sum(-1, keepdim=True)).clamp_min(MIN_PREFIX_MASS)
    return mass.log() - rest.log()


def build_student(
    teacher: ViT,
    attention: list[MeanAttention],
    fits: list[AtomFit],
    steer: tuple[str, ...],
    max_offset: float = 4.0,
) -> ViT:
    """The student of ``teacher`` (module doc) from each layer's mean attention and atom fit on the pictures."""
    cfg = student_config(teacher.config, int(fits[0].mu.shape[1]), steer, max_offset)
    if len(fits) != cfg.depth or len(attention) != cfg.depth:
        raise DistillError(f"{len(fits)} layer fits for a teacher of {cfg.depth} layers")
    student = ViT(cfg)
    state = student.state_dict()
    dim = cfg.dim
    for name, value in teacher.state_dict().items():
        if ".attn.qkv." not in name:
            state[name] = value.clone()
            continue
        base = name.replace(".qkv.", ".")
        state[base.replace(".attn.", ".attn.v.")] = value[2 * dim :].clone()
        if cfg.num_prefix_tokens:
            state[base.replace(".attn.", ".attn.qk.")] = value[: 2 * dim].clone()
    for layer, (fit, mean) in enumerate(zip(fits, attention, strict=True)):
        for key, value in field_parameters(fit, cfg.sigma_floor).items():
            state[f"blocks.{layer}.attn.{key}"] = value.float()
        if cfg.num_prefix_tokens:
            state[f"blocks.{layer}.attn.prefix_logits"] = prefix_logits(mean).float()
    student.load_state_dict(state)
    return student.to(next(teacher.parameters()).device).eval()


def steering_parameters(student: ViT, train: str) -> list[tuple[str, nn.Parameter]]:
    """The parameters ``--train`` trains: ``steering`` the probes and gates; ``fields`` also each layer's fixed
    field (atoms, τ) and prefix mass; ``all`` every parameter."""
    chosen = []
    for name, p in student.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        owner = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        steering = ".attn." in name and (leaf.endswith("_scale") or owner in ("mu_delta", "sigma_delta", "lambda_gate"))
        field = ".attn." in name and leaf in (*FIELD_PARAMETERS, "prefix_logits")
        if train == "all" or steering or (train == "fields" and field):
            chosen.append((name, p))
    return chosen


def teacher_licence(folder: str | Path) -> str | None:
    """The licence a model folder states (its README's ``license:`` front matter or its config's ``license``), or
    ``None``."""
    path = Path(folder)
    if not path.is_dir():
        return None
    readme = path / "README.md"
    if readme.is_file():
        text = readme.read_text(encoding="utf-8", errors="replace")
        if text.startswith("---"):
            for line in text.split("---", 2)[1].splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "license" and value.strip():
                    return value.strip().strip("'\"")
    config = path / "config.json"
    if config.is_file():
        try:
            found = json.loads(config.read_text(encoding="utf-8")).get("license")
        except (ValueError, AttributeError):
            return None
        return str(found) if found else None
    return None


def content_scored(config: ViTConfig) -> str:
    """What still scores content in a student of ``config``, in words."""
    p, t = config.num_prefix_tokens, config.num_prefix_tokens + config.grid[0] * config.grid[1]
    if not p:
        return "nothing: every query's row is its head's field, steered by content"
    return (
        f"the {p} prefix quer{'y' if p == 1 else 'ies'} per head (dot product over all {t} tokens: "
        f"{p}/{t} = {p / t:.1%} of the rows); patch queries' mass on prefix keys is content-blind"
    )

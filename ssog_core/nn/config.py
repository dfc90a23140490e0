"""Model configuration: one typed, validated record that checkpoints carry with their weights."""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import Any

from ssog_core.field import FIELD_MODES, MAX_ATOMS, TAPS

ATTENTION_KINDS = ("ssog", "dot", "rbf")
POSITIVE = ("patch_size", "dim", "depth", "num_heads", "in_chans")  # sizes of at least 1
FAMILIES = ("lab", "timm", "vit", "deit", "dinov2", "dinov2_with_registers")  # whose conventions the weights follow
POOLS = ("avg", "token", "token+avg")  # patch mean, class token, DINOv2's class token beside the patch mean
QK_NORMS = ("rms", "layernorm")  # per head: RMS without gain (the lab's) or LayerNorm with gain and bias (timm's)
PATCH_ORDERS = ("hwc", "chw")  # a patch flattened (row, col, channel) (the lab's) or (channel, row, col) (a conv's)
POS_RESIZES = ("bilinear", "bicubic")  # how the position embedding follows a new grid (the lab's; timm's and HF's)
FAMILY_NAMES = {  # each family in words, for messages and the app
    "lab": "SSOG Lab",
    "timm": "timm",
    "vit": "transformers ViT",
    "deit": "DeiT",
    "dinov2": "DINOv2",
    "dinov2_with_registers": "DINOv2 with registers",
}
LAB_EPS = 1e-5  # torch's LayerNorm default, which the lab's models use
TIMM_EPS = 1e-6  # timm's LayerNorm epsilon


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of a :class:`ssog_core.nn.vit.ViT` (docs/DESIGN.md §2): the lab's models and every standard ViT.

    Defaults are a small CIFAR-size model like the SSOG post's (patch 4 here; its CIFAR runs use patch 2); each
    field says why it is what it is. The fields from ``family`` on are the conventions of the family the weights
    come from (the readers in :mod:`ssog_core.checkpoint.standard` set them); their defaults are the lab's, so a
    lab checkpoint written before they existed still reads as what it is.
    """

    num_classes: int = 100  # 0: no head, the model returns its pooled features (timm's num_classes=0)
    img_size: tuple[int, int] = (32, 32)  # training resolution (H, W); other multiples of the patch still run
    patch_size: int = 4
    dim: int = 256
    depth: int = 6
    num_heads: int = 4
    mlp_ratio: float = 2.0  # the SSOG post's ratio: SSOG's savings come from dropping Q/K, not from a thin MLP
    dropout: float = 0.1  # after the position embedding and on both residual branches (training only)
    in_chans: int = 3
    attn: str = "ssog"  # "ssog" (Gaussian field), "dot" (dot-product, SDPA) or "rbf" (distance attention)
    # SSOG only
    num_atoms: int = 4  # Gaussians per head; 1 already works, 4 is the SSOG post's sweet spot, 8 the cap
    field: str = "factorized"  # per-atom separable passes, or "axial" (atoms mixed in logit space per axis)
    steer: tuple[str, ...] = TAPS  # enabled content taps; () is the purely fixed field
    max_offset: float = 4.0  # bound on how far content may move an atom, in grid cells
    sigma_floor: float = 0.25  # narrowest atom, in grid cells
    cold_init: bool = True  # gates start at softplus(-8) + 1e-4 = 4.35e-4 (frozen geometry); False: softplus(-2)
    prefix_dot: bool = False  # prefix tokens with SSOG: their queries score content (dot product over every token),
    # patch queries put a learned content-blind mass on each (a distilled student's; docs/DESIGN.md §2.5)
    # dot / rbf only
    num_registers: int = 0  # learned prefix tokens, stripped after the last block (zero-init for rbf)
    susie: bool = False  # add the 2D SuSiE position code to q and k (RoPE would break RBF's distances)
    susie_dim: int = 0  # channels per head with SuSiE (a multiple of 4); 0 = the whole head, as in the RBF post
    qk_norm: bool = False  # dot only: normalise q and k per head (qk_norm_kind), the cure for key-magnitude dominance
    # the family's conventions
    family: str = "lab"  # whose conventions the weights follow (FAMILIES): what the app calls the model
    mlp_hidden: int = 0  # the MLP's width; 0: dim × mlp_ratio
    eps: float = LAB_EPS  # every LayerNorm's epsilon (timm 1e-6, transformers' ViT / DeiT 1e-12)
    qkv_bias: bool = False  # biases of q, k and v
    proj_bias: bool = False  # bias of the attention's output projection
    mlp_bias: bool = True  # biases of both MLP layers
    qk_norm_kind: str = "rms"  # with qk_norm: "rms" (no gain, the lab's) or "layernorm" (gain and bias, timm's)
    layer_scale: bool = False  # a learned per-channel gain on each residual branch (timm's init_values)
    class_token: bool = False
    dist_token: bool = False  # DeiT's distillation token, after the class token
    pos_prefix: int = 0  # how many leading prefix tokens have a position embedding (0: timm's no_embed_class)
    pool: str = "avg"  # POOLS: what the head reads
    fc_norm: bool = False  # the final norm after pooling instead of before
    distilled: bool = False  # DeiT: a second head on the distillation token, the two logits averaged
    patch_order: str = "hwc"  # PATCH_ORDERS: how a patch is flattened for the patch embedding
    pos_resize: str = "bilinear"  # POS_RESIZES: the position embedding's rule on another grid
    resize_antialias: bool = False  # the resize antialiases (timm, DINOv2 with registers)
    resize_in_float32: bool = False  # and runs in float32 whatever the model's dtype (timm, DINOv2)
    mean: tuple[float, ...] = ()  # the model normalises its [0, 1] input with these (empty: the input as given)
    std: tuple[float, ...] = ()

    @property
    def grid(self) -> tuple[int, int]:
        """Token grid (Gh, Gw) at the config's input size (the position embedding's own grid)."""
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def mlp_width(self) -> int:
        return self.mlp_hidden or int(self.dim * self.mlp_ratio)

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patches: class, distillation, registers."""
        return int(self.class_token) + int(self.dist_token) + self.num_registers

    def __post_init__(self) -> None:
        size = self.img_size
        if isinstance(size, int):
            size = (size, size)
        object.__setattr__(self, "img_size", tuple(int(s) for s in size))
        object.__setattr__(self, "steer", tuple(self.steer))
        object.__setattr__(self, "mean", tuple(self.mean))
        object.__setattr__(self, "std", tuple(self.std))
        self.validate()

    def _type_problems(self) -> list[str]:
        """Fields of the wrong type or sign (a config read from a file can hold anything), checked before the
        rules of :meth:`validate` do arithmetic with them."""
        problems = []
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), f.type
            if kind == "int" and not (isinstance(value, numbers.Integral) and not isinstance(value, bool)):
                problems.append(f"{f.name}={value!r} must be a whole number")
            elif kind == "int" and f.name in POSITIVE and value < 1:
                problems.append(f"{f.name} must be >= 1")
            elif kind == "float" and not (
                isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
            ):
                problems.append(f"{f.name}={value!r} must be a finite number >= 0")
            elif kind == "bool" and value not in (True, False):
                problems.append(f"{f.name}={value!r} must be true or false")
            elif kind == "str" and not isinstance(value, str):
                problems.append(f"{f.name}={value!r} must be a string")
        if not all(isinstance(t, str) for t in self.steer):
            problems.append(f"steer={self.steer!r} must be tap names")
        if not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in (*self.mean, *self.std)):
            problems.append("mean and std must be finite numbers")
        return problems

    def validate(self) -> None:
        problems = self._type_problems()
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))
        if self.attn not in ATTENTION_KINDS:
            problems.append(f"attn={self.attn!r} is not one of {ATTENTION_KINDS}")
        if len(self.img_size) != 2 or any(s % self.patch_size for s in self.img_size) or min(self.img_size) < 1:
            problems.append(f"img_size={self.img_size} must be positive multiples of patch_size={self.patch_size}")
        if self.dim % self.num_heads:
            problems.append(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        if not 1 <= self.num_atoms <= MAX_ATOMS:
            problems.append(f"num_atoms={self.num_atoms} must be between 1 and {MAX_ATOMS}")
        if self.field not in FIELD_MODES:
            problems.append(f"field={self.field!r} is not one of {FIELD_MODES}")
        unknown = [t for t in self.steer if t not in TAPS]
        if unknown or len(set(self.steer)) != len(self.steer):
            problems.append(f"steer={self.steer} must be distinct taps from {TAPS}")
        for name in ("num_classes", "num_registers", "mlp_hidden", "pos_prefix"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must be >= 0")
        if self.num_prefix_tokens and self.attn == "ssog" and not self.prefix_dot:
            problems.append(
                "register tokens have no grid position (nor have class and distillation tokens): use them with "
                "attn='dot' or 'rbf', or with SSOG's prefix_dot (their queries scored by dot product)"
            )
        if self.prefix_dot and self.attn != "ssog":
            problems.append("prefix_dot is for attn='ssog' only (dot and RBF score every query already)")
        if (self.susie or self.susie_dim) and self.attn == "ssog":
            problems.append("SuSiE codes positions into queries and keys, which SSOG does not have")
        head_dim = self.dim // self.num_heads if self.num_heads >= 1 else 0
        width = self.susie_dim or head_dim
        if self.susie and (width % 4 or not 0 < width <= head_dim):
            problems.append(
                f"susie_dim={self.susie_dim} must give a width in (0, head_dim] that is a multiple of 4 "
                "(half the frequency pairs code the row, half the column)"
            )
        if self.susie_dim and not self.susie:
            problems.append("susie_dim is set but susie is off")
        if self.qk_norm and self.attn != "dot":
            problems.append(
                "qk_norm is for attn='dot' only (with unit-RMS keys RBF attention collapses to dot-product "
                "attention, and SSOG has no keys)"
            )
        problems += self._convention_problems()
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    def _convention_problems(self) -> list[str]:
        """What a family's conventions cannot combine to."""
        p = []
        for name, value, allowed in (
            ("family", self.family, FAMILIES),
            ("pool", self.pool, POOLS),
            ("qk_norm_kind", self.qk_norm_kind, QK_NORMS),
            ("patch_order", self.patch_order, PATCH_ORDERS),
            ("pos_resize", self.pos_resize, POS_RESIZES),
        ):
            if value not in allowed:
                p.append(f"{name}={value!r} is not one of {allowed}")
        if not self.eps > 0:
            p.append(f"eps={self.eps} must be positive")
        if self.pos_prefix > self.num_prefix_tokens:
            p.append(f"pos_prefix={self.pos_prefix} is more than the {self.num_prefix_tokens} prefix token(s)")
        if "token" in self.pool and not self.class_token:
            p.append(f"pool={self.pool!r} reads the class token, which this model does not have")
        if self.distilled and not (self.dist_token and self.pool == "token" and not self.fc_norm):
            p.append("a distilled head needs the distillation token and class-token pooling")
        if (self.mean or self.std) and (
            len(self.mean) != self.in_chans or len(self.std) != self.in_chans or min(self.std) <= 0
        ):
            p.append(f"mean / std need {self.in_chans} values each, std positive")
        return p

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["img_size"] = list(self.img_size)
        d["steer"] = list(self.steer)
        d["mean"], d["std"] = list(self.mean), list(self.std)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        """Build from a dict, refusing unknown keys (they usually mean a typo or a newer format)."""
        if not isinstance(d, dict):
            raise ValueError(f"model config must be a JSON object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        try:
            return cls(**d)
        except TypeError as e:
            raise ValueError(f"invalid model config: {e}") from None

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)


# The SSOG post's six ImageNet configurations (docs/DESIGN.md §2): exact parameter counts and approximate FLOPs.
_IMAGENET = dict(num_classes=1000, img_size=224, patch_size=16, mlp_ratio=2.0)
_D256 = dict(_IMAGENET, dim=256, depth=6, num_heads=4)
_D384 = dict(_IMAGENET, dim=384, depth=12, num_heads=6)
SEED_CONFIGS: dict[str, tuple[ViTConfig, int, float | None]] = {
    "d256-dot": (ViTConfig(**_D256, attn="dot"), 3_661_032, 1.5e9),
    "d256-ssog-fixed": (ViTConfig(**_D256, attn="ssog", steer=()), 2_875_086, None),
    "d256-ssog-mu": (ViTConfig(**_D256, attn="ssog", steer=("mu",)), 2_924_436, None),
    "d256-ssog-all": (ViTConfig(**_D256, attn="ssog"), 2_998_464, 1.0e9),
    "d384-dot": (ViTConfig(**_D384, attn="dot"), 14_944_360, 6.3e9),
    "d384-ssog-all": (ViTConfig(**_D384, attn="ssog"), 11_961_304, 4.4e9),
}


# timm's VisionTransformer defaults: what a standard ViT is unless its family's reader says otherwise.
STANDARD_CONVENTIONS: dict[str, Any] = dict(
    attn="dot", dropout=0.0, eps=TIMM_EPS, qkv_bias=True, proj_bias=True, mlp_bias=True, qk_norm_kind="layernorm",
    class_token=True, pos_prefix=1, pool="token", patch_order="chw", pos_resize="bicubic", resize_antialias=True,
    resize_in_float32=True,
)  # fmt: skip


def standard_config(family: str = "timm", **fields: Any) -> ViTConfig:
    """The config of a standard ViT of ``family``: timm's conventions (:data:`STANDARD_CONVENTIONS`), then
    ``fields``."""
    return ViTConfig(**{**STANDARD_CONVENTIONS, "family": family, **fields})

"""A small causal language model with dot-product or RBF attention, trained on any plain-text file.

    python -m ssog_core.lm --text tinystories.txt --attn dot,rbf --steps 2000 --out runs/lm

trains one model per attention kind with the same seed, initial weights (the two share every parameter
shape) and batches; prints both loss curves side by side; writes ``losses.jsonl``, ``losses.png`` and a
safetensors checkpoint per kind into ``--out``; and samples text from each. ``--sample-from CKPT`` only
samples. Tokens are bytes (vocabulary 256, any text) or the text's characters (``--tokenizer char``).

The model: token embedding (+ a learned absolute position embedding if ``position="learned"``), optional
register tokens prepended (zero for RBF so a query can "look away" at distance ‖q‖, N(0, 0.02²) for dot),
pre-norm blocks with causal attention and a GELU MLP, final LayerNorm, linear head. With
``position="susie"`` (default) the 1D SuSiE code is added to queries and keys in every layer instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ssog_core.attention import DotAttention, RBFAttention
from ssog_core.checkpoint import (
    CheckpointError,
    read_safetensors,
    software_versions,
    state_dict_problems,
)
from ssog_core.files import atomic_write
from ssog_core.vit import Block

LM_FORMAT = "ssog-lab-lm/1"
POSITIONS = ("susie", "learned", "none")
LM_ATTENTION = ("dot", "rbf")


@dataclass(frozen=True)
class LMConfig:
    """Architecture of a :class:`CausalLM`; each default says why it is what it is."""

    vocab_size: int = 256  # bytes; a char tokenizer sets its own
    context: int = 256  # tokens per window (registers not counted): TinyStories' stories fit
    dim: int = 256
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0  # the usual language-model MLP
    dropout: float = 0.0  # small models on a few million tokens barely overfit
    attn: str = "rbf"  # "dot" (SDPA) or "rbf" (distance attention)
    position: str = "susie"  # SuSiE in q and k (works for both kinds), "learned" absolute embedding, or "none"
    susie_dim: int = 0  # channels per head carrying SuSiE (even); 0 = the whole head, as in the RBF post
    qk_norm: bool = False  # dot only: RMS-normalised q and k
    num_registers: int = 1  # prefix tokens every position can attend to (an attention sink by design)

    def __post_init__(self) -> None:
        problems = []
        if self.attn not in LM_ATTENTION:
            problems.append(f"attn={self.attn!r} is not one of {LM_ATTENTION}")
        if self.position not in POSITIONS:
            problems.append(f"position={self.position!r} is not one of {POSITIONS}")
        for name in ("vocab_size", "context", "dim", "depth", "num_heads"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1")
        if self.num_heads >= 1 and self.dim % self.num_heads:
            problems.append(f"dim={self.dim} must be divisible by num_heads={self.num_heads}")
        head_dim = self.dim // max(self.num_heads, 1)
        if self.susie_dim and (self.position != "susie" or self.susie_dim % 2 or self.susie_dim > head_dim):
            problems.append(f"susie_dim={self.susie_dim} needs position='susie' and an even width <= {head_dim}")
        if self.position == "susie" and not self.susie_dim and head_dim % 2:
            problems.append(f"SuSiE over the whole head needs an even head dim, got {head_dim}")
        if self.qk_norm and self.attn != "dot":
            problems.append("qk_norm is for attn='dot' only (RBF with unit-RMS keys is dot-product attention)")
        if self.num_registers < 0 or self.mlp_ratio <= 0 or not 0 <= self.dropout < 1:
            problems.append("num_registers >= 0, mlp_ratio > 0 and 0 <= dropout < 1 are required")
        if problems:
            raise ValueError("invalid language-model config: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMConfig:
        """Build from a dict, refusing unknown keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"unknown language-model config field(s): {', '.join(unknown)}")
        return cls(**d)


def _codepoints(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


class Tokenizer:
    """Bytes (UTF-8, vocabulary 256) or the characters of a training text (vocabulary = its alphabet).

    :meth:`encode` returns a compact integer stream (uint8 for bytes, int32 for characters) so that a text
    of a few GB stays a few GB; batches are widened to int64 when they are cut from it.
    """

    def __init__(self, kind: str = "byte", chars: str = ""):
        if kind not in ("byte", "char"):
            raise ValueError(f"tokenizer must be 'byte' or 'char', got {kind!r}")
        if kind == "char" and not chars:
            raise ValueError("a character tokenizer needs its alphabet")
        self._sorted = np.unique(_codepoints(chars))  # alphabet code points; a character's id is its rank
        self.kind, self.chars = kind, "".join(chr(c) for c in self._sorted)

    @classmethod
    def for_text(cls, text: str, kind: str) -> Tokenizer:
        return cls(kind, text if kind == "char" else "")

    @property
    def vocab_size(self) -> int:
        return 256 if self.kind == "byte" else len(self.chars)

    def encode(self, text: str) -> Tensor:
        if self.kind == "byte":
            return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8)
        cps = _codepoints(text)
        ids = np.searchsorted(self._sorted, cps).clip(0, len(self._sorted) - 1)
        unknown = self._sorted[ids] != cps
        if unknown.any():
            missing = "".join(sorted({chr(c) for c in cps[unknown][:1000]}))
            raise ValueError(f"characters not in the tokenizer's alphabet: {missing!r}")
        return torch.from_numpy(ids.astype(np.int32))

    def decode(self, ids: Sequence[int]) -> str:
        if self.kind == "byte":
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "chars": self.chars}


def _attention(cfg: LMConfig) -> nn.Module:
    """The causal attention module of one block."""
    susie = "1d" if cfg.position == "susie" else None
    if cfg.attn == "rbf":
        return RBFAttention(cfg.dim, cfg.num_heads, susie=susie, susie_dim=cfg.susie_dim, causal=True)
    return DotAttention(cfg.dim, cfg.num_heads, qk_norm=cfg.qk_norm, susie=susie, susie_dim=cfg.susie_dim, causal=True)


class CausalLM(nn.Module):
    """Next-token model over ``(B, T)`` token ids; a sequence is a ``1 × T`` grid for the attention modules."""

    def __init__(self, config: LMConfig):
        super().__init__()
        self.config = cfg = config
        self.tok_embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        nn.init.normal_(self.tok_embed.weight, std=0.02)
        if cfg.position == "learned":
            self.pos_embed = nn.Parameter(torch.randn(1, cfg.context, cfg.dim) * 0.02)
        if cfg.num_registers:
            std = 0.0 if cfg.attn == "rbf" else 0.02  # RBF: keys start at the origin, equally close to all queries
            self.registers = nn.Parameter(torch.randn(1, cfg.num_registers, cfg.dim) * std)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(
            Block(cfg.dim, _attention(cfg), cfg.mlp_ratio, cfg.dropout) for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)  # near-uniform first predictions: initial loss ≈ log(vocab)

    @property
    def num_prefix_tokens(self) -> int:
        return self.config.num_registers

    def forward(self, idx: Tensor, attn_inputs: list[Tensor] | None = None) -> Tensor:
        """Logits ``(B, T, vocab)``; if ``attn_inputs`` is a list, each block appends its attention's input."""
        b, t = idx.shape
        if self.config.position == "learned" and t > self.config.context:
            raise ValueError(f"{t} tokens exceed the learned position embedding's {self.config.context}")
        x = self.tok_embed(idx)
        if self.config.position == "learned":
            x = x + self.pos_embed[:, :t]
        x = self.drop(x)
        if self.config.num_registers:
            x = torch.cat([self.registers.expand(b, -1, -1).to(x.dtype), x], dim=1)
        for block in self.blocks:
            x = block(x, (1, t), attn_inputs)
        return self.head(self.norm(x[:, self.num_prefix_tokens :]))

    def loss(self, idx: Tensor, targets: Tensor) -> Tensor:
        logits = self(idx)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        new_tokens: int,
        temperature: float = 0.8,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Append ``new_tokens`` sampled tokens to ``idx`` (``(B, T)``), seeing at most ``context`` tokens."""
        if temperature <= 0:
            raise ValueError("temperature must be > 0")
        for _ in range(new_tokens):
            logits = self(idx[:, -self.config.context :])[:, -1].float() / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
        return idx


def save_lm(path: str | Path, model: CausalLM, tokenizer: Tokenizer, meta: dict[str, Any] | None = None) -> Path:
    """Weights, config, tokenizer and ``meta`` in one safetensors file, written atomically."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    header = {
        "format": LM_FORMAT,
        "config": json.dumps(model.config.to_dict()),
        "tokenizer": json.dumps(tokenizer.to_dict()),
        "meta": json.dumps({"software": software_versions(), **(meta or {})}),
    }
    return atomic_write(path, lambda tmp: save_file(state, tmp, metadata=header))


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
    model = CausalLM(config)
    problems = state_dict_problems(model, state)
    if problems:
        raise CheckpointError(f"{path.name} does not match its config: " + "; ".join(problems))
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model.to(device).eval(), tokenizer, meta


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings (the same for every attention kind in a comparison)."""

    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decay ends at lr · this
    warmup: int = 50  # linear warm-up steps
    weight_decay: float = 0.1  # on Linear and Embedding weight matrices only
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    val_fraction: float = 0.1  # the last part of the text is held out


def split_tokens(ids: Tensor, val_fraction: float) -> tuple[Tensor, Tensor]:
    """Train / validation token streams; each must hold at least one (input, target) pair."""
    n_val = int(len(ids) * val_fraction)
    train, val = ids[: len(ids) - n_val], ids[len(ids) - n_val :]
    if len(train) < 2 or len(val) < 2:
        raise ValueError(
            f"the text has {len(ids)} tokens: too short to hold out {val_fraction:.0%} for validation "
            "and still train (each part needs at least 2 tokens)"
        )
    return train, val


def sample_batch(stream: Tensor, batch: int, context: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows ``(B, T)`` and their next-token targets; ``T = min(context, len(stream) − 1)``."""
    t = min(context, len(stream) - 1)
    starts = torch.randint(0, len(stream) - t, (batch,), generator=generator)
    idx = torch.stack([stream[s : s + t] for s in starts.tolist()]).long()
    tgt = torch.stack([stream[s + 1 : s + 1 + t] for s in starts.tolist()]).long()
    return idx, tgt


def _optimizer(model: nn.Module, settings: TrainSettings) -> torch.optim.AdamW:
    decay = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear | nn.Embedding)}
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if id(p) in decay], "weight_decay": settings.weight_decay},
        {"params": [p for p in params if id(p) not in decay], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95))


def learning_rate(step: int, settings: TrainSettings) -> float:
    """Linear warm-up, then cosine decay to ``lr · min_lr_ratio`` at the last step."""
    if step < settings.warmup:
        return settings.lr * (step + 1) / settings.warmup
    progress = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return settings.lr * (
        settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    )


def train_lm(
    ids: Tensor,
    config: LMConfig,
    settings: TrainSettings,
    seed: int = 0,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> tuple[CausalLM, list[dict[str, Any]]]:
    """Train a model on token stream ``ids``; returns it (eval mode) and its loss history.

    The seed fixes the initial weights, the training batches and the validation batches, so two calls
    that differ only in ``config.attn`` see the same data in the same order.
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    train, val = split_tokens(ids, settings.val_fraction)
    torch.manual_seed(seed)
    model = CausalLM(config).to(device)
    opt = _optimizer(model, settings)
    data_gen = torch.Generator().manual_seed(seed)
    val_gen = torch.Generator().manual_seed(seed + 1)
    val_batches = [
        sample_batch(val, settings.batch_size, config.context, val_gen) for _ in range(settings.eval_batches)
    ]

    def amp() -> torch.autocast:  # bf16 matmuls on GPU; the loss is taken in fp32 either way
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    def evaluate() -> float:
        model.eval()
        with torch.no_grad(), amp():
            losses = [float(model.loss(x.to(device), y.to(device))) for x, y in val_batches]
        model.train()
        return sum(losses) / len(losses)

    history = [
        {"attn": config.attn, "step": 0, "train_loss": None, "val_loss": evaluate(), "lr": 0.0, "elapsed_s": 0.0}
    ]
    start, running = time.perf_counter(), []
    bar = tqdm(range(1, settings.steps + 1), desc=f"train {config.attn}", disable=not progress, leave=False)
    model.train()
    for step in bar:
        lr = learning_rate(step - 1, settings)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = sample_batch(train, settings.batch_size, config.context, data_gen)
        with amp():
            loss = model.loss(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        running.append(float(loss.detach()))
        bar.set_postfix(loss=f"{running[-1]:.3f}")
        if step % settings.eval_every == 0 or step == settings.steps:
            history.append(
                {
                    "attn": config.attn,
                    "step": step,
                    "train_loss": sum(running) / len(running),
                    "val_loss": evaluate(),
                    "lr": lr,
                    "elapsed_s": time.perf_counter() - start,
                }
            )
            running = []
    return model.eval(), history


def loss_table(histories: dict[str, list[dict[str, Any]]]) -> str:
    """Side-by-side loss curves: one row per evaluation step, train / val columns per attention kind."""
    kinds = list(histories)
    head = f"{'step':>7} " + " ".join(f"{k + ' train':>11} {k + ' val':>9}" for k in kinds)
    rows = [head]
    for records in zip(*histories.values(), strict=True):
        cells = []
        for r in records:
            train = "-" if r["train_loss"] is None else f"{r['train_loss']:.4f}"
            cells.append(f"{train:>11} {r['val_loss']:>9.4f}")
        rows.append(f"{records[0]['step']:>7} " + " ".join(cells))
    return "\n".join(rows)


def plot_losses(histories: dict[str, list[dict[str, Any]]], path: str | Path, title: str = "") -> Path:
    """Train (dashed) and validation (solid) loss vs step for each attention kind, as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure state

    fig = Figure(figsize=(7, 4.2))
    ax = fig.subplots()
    for i, (kind, records) in enumerate(histories.items()):
        color = f"C{i}"
        trained = [r for r in records if r["train_loss"] is not None]
        ax.plot(
            [r["step"] for r in trained], [r["train_loss"] for r in trained], "--", color=color, label=f"{kind} train"
        )
        ax.plot(
            [r["step"] for r in records], [r["val_loss"] for r in records], "-o", ms=3, color=color, label=f"{kind} val"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.set_title(title or "causal LM: dot vs RBF attention")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")

    return atomic_write(path, write)


def _sample(model: CausalLM, tokenizer: Tokenizer, prompt: str, args: argparse.Namespace, device) -> str:
    if not prompt:  # start from a line break, or the alphabet's first character if the text has none
        prompt = "\n" if tokenizer.kind == "byte" or "\n" in tokenizer.chars else tokenizer.chars[0]
    ids = tokenizer.encode(prompt).long()[None].to(device)
    gen = torch.Generator().manual_seed(args.seed)
    out = model.generate(ids, args.sample_tokens, args.temperature, args.top_k, gen)
    return tokenizer.decode(out[0, ids.shape[1] :].tolist())


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m ssog_core.lm", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--text", type=Path, help="plain-text training file (UTF-8)")
    ap.add_argument("--attn", default="dot,rbf", help="comma-separated attention kinds to train: dot, rbf")
    ap.add_argument("--out", type=Path, default=Path("runs/lm"), help="folder for checkpoints, losses.jsonl/png")
    ap.add_argument("--sample-from", type=Path, help="only sample from this checkpoint")
    g = ap.add_argument_group("model")
    g.add_argument("--tokenizer", choices=("byte", "char"), default="byte")
    g.add_argument("--context", type=int, default=LMConfig.context)
    g.add_argument("--dim", type=int, default=LMConfig.dim)
    g.add_argument("--depth", type=int, default=LMConfig.depth)
    g.add_argument("--heads", type=int, default=LMConfig.num_heads)
    g.add_argument("--mlp-ratio", type=float, default=LMConfig.mlp_ratio)
    g.add_argument("--dropout", type=float, default=LMConfig.dropout)
    g.add_argument("--position", choices=POSITIONS, default=LMConfig.position)
    g.add_argument("--susie-dim", type=int, default=LMConfig.susie_dim)
    g.add_argument("--registers", type=int, default=LMConfig.num_registers)
    g.add_argument("--qk-norm", action="store_true", help="QK-norm for the dot model (ignored for rbf)")
    g = ap.add_argument_group("training")
    for f in dataclasses.fields(TrainSettings):  # --steps, --batch-size, --lr, ... with the dataclass defaults
        g.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto (CUDA if present), cpu or cuda")
    g.add_argument("--quiet", action="store_true", help="no progress bars")
    g = ap.add_argument_group("sampling")
    g.add_argument("--prompt", default="", help="text to continue (default: a newline)")
    g.add_argument("--sample-tokens", type=int, default=200)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=None)
    return ap


def main(argv: list[str] | None = None) -> None:
    ap = _parser()
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if args.sample_from:
        try:
            model, tokenizer, _ = load_lm(args.sample_from, device)
            print(_sample(model, tokenizer, args.prompt, args, device))
        except (CheckpointError, ValueError) as e:
            ap.error(str(e))
        return
    if args.text is None:
        ap.error("--text FILE is required (or --sample-from CKPT)")
    kinds = [k.strip() for k in args.attn.split(",") if k.strip()]
    bad = [k for k in kinds if k not in LM_ATTENTION]
    if bad or not kinds or len(set(kinds)) != len(kinds):
        ap.error(f"--attn: give distinct kinds from {LM_ATTENTION}, e.g. dot,rbf")
    try:
        text = args.text.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        ap.error(f"--text: cannot read {args.text}: {e}")
    tokenizer = Tokenizer.for_text(text, args.tokenizer)
    ids = tokenizer.encode(text)
    settings = TrainSettings(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings)})
    try:
        configs = {
            k: LMConfig(
                vocab_size=tokenizer.vocab_size,
                context=args.context,
                dim=args.dim,
                depth=args.depth,
                num_heads=args.heads,
                mlp_ratio=args.mlp_ratio,
                dropout=args.dropout,
                attn=k,
                position=args.position,
                susie_dim=args.susie_dim,
                qk_norm=args.qk_norm and k == "dot",
                num_registers=args.registers,
            )
            for k in kinds
        }
        split_tokens(ids, settings.val_fraction)  # fail before training if the text is too short
    except ValueError as e:
        ap.error(str(e))
    print(
        f"{args.text.name}: {len(ids):,} {args.tokenizer} tokens (vocabulary {tokenizer.vocab_size}); device {device}"
    )
    histories, models = {}, {}
    for kind, cfg in configs.items():
        model, history = train_lm(ids, cfg, settings, args.seed, device, progress=not args.quiet)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"{kind}: {n_params:,} parameters, final val loss {history[-1]['val_loss']:.4f}")
        meta = {"data": str(args.text), "steps": settings.steps, "seed": args.seed, "history": history}
        save_lm(args.out / f"lm-{kind}.safetensors", model, tokenizer, meta)
        histories[kind], models[kind] = history, model
    print("\nloss curves (nats / token):\n" + loss_table(histories))
    write_jsonl([r for h in histories.values() for r in h], args.out / "losses.jsonl")
    plot_losses(histories, args.out / "losses.png", f"{args.text.name}: {' vs '.join(kinds)}")
    print(f"\nwrote {args.out / 'losses.jsonl'}, {args.out / 'losses.png'} and lm-{{{','.join(kinds)}}}.safetensors")
    for kind, model in models.items():
        print(f"\n--- sample ({kind}) ---\n{args.prompt}{_sample(model, tokenizer, args.prompt, args, device)}")


if __name__ == "__main__":
    main()

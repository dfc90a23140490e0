"""Train the causal language model of :mod:`ssog_core.nn.lm` on any plain-text file, and compare attention kinds.

    python -m ssog_core lm-train --text tinystories.txt --attn dot,rbf --steps 2000 --out runs/lm

trains one model per attention kind with the same seed, initial weights (the two share every parameter
shape) and batches; prints both loss curves side by side; writes ``losses.jsonl``, ``losses.png`` and a
safetensors checkpoint per kind into ``--out``; and samples text from each. ``--sample-from CKPT`` only
samples. Tokens are bytes (vocabulary 256, any text) or the text's characters (``--tokenizer char``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from ssog_core.checkpoint.format import CheckpointError
from ssog_core.checkpoint.lm import load_lm, save_lm
from ssog_core.nn.lm import LM_ATTENTION, POSITIONS, CausalLM, LMConfig, Tokenizer
from ssog_core.train.lm import TrainSettings, loss_table, plot_losses, split_tokens, train_lm, write_jsonl


def _sample(model: CausalLM, tokenizer: Tokenizer, prompt: str, args: argparse.Namespace, device) -> str:
    if not prompt:  # start from a line break, or the alphabet's first character if the text has none
        prompt = "\n" if tokenizer.kind == "byte" or "\n" in tokenizer.chars else tokenizer.chars[0]
    ids = tokenizer.encode(prompt).long()[None].to(device)
    gen = torch.Generator().manual_seed(args.seed)
    out = model.generate(ids, args.sample_tokens, args.temperature, args.top_k, gen)
    return tokenizer.decode(out[0, ids.shape[1] :].tolist())


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m ssog_core lm-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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

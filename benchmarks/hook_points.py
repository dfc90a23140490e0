"""What the hook points cost a forward pass with no hook installed: the same model timed with the points' calls
and with them removed, in interleaved pairs (so a loaded machine slows both alike).

    python benchmarks/hook_points.py [--pairs 400] [--threads 1]

Prints one line: the median forward time both ways and their difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ssog_core import ViT
from ssog_core.nn.hook_points import HookPoint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ViT(num_classes=10, img_size=(32, 32), patch_size=4, dim=128, depth=6, num_heads=4, num_atoms=4).eval()
    x = torch.rand(8, 3, 32, 32)
    points = sum(isinstance(m, HookPoint) for m in model.modules())
    ways = {"with the points": HookPoint.__call__, "without their calls": lambda self, a: a}
    times: dict[str, list[float]] = {name: [] for name in ways}
    try:
        with torch.inference_mode():
            for _ in range(5):
                model(x)
            for i in range(args.pairs):
                for name in list(ways)[:: 1 if i % 2 else -1]:
                    HookPoint.__call__ = ways[name]
                    start = time.perf_counter()
                    model(x)
                    times[name].append(time.perf_counter() - start)
    finally:
        HookPoint.__call__ = ways["with the points"]
    with_, without = (statistics.median(t) for t in times.values())
    print(
        f"d128 depth-6 SSOG ViT, batch 8, 8×8 grid, {points} hook points, {args.threads} thread(s), {args.pairs} "
        f"interleaved pairs: median forward {with_ * 1e3:.2f} ms with the points, {without * 1e3:.2f} ms without "
        f"their calls ({100 * (with_ - without) / without:+.2f}%)"
    )


if __name__ == "__main__":
    main()

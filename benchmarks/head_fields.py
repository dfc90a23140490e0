"""What the head-as-field instrument costs on standard ViTs with random weights (so no download is needed): a
ViT-S/16 at 224² — one image's attention and export maps, and the heads measured as fields over 64 images (two
passes, the 4-atom fit of all 72 heads timed on its own too); a ViT-B/16 at 448² — every layer's pattern of one image
kept (``blocks.{l}.attn.pattern``), the peak memory that adds, each case in a fresh process (``ru_maxrss``).

    python benchmarks/head_fields.py [--threads 2] [--repeats 3]

Writes results/head_fields_cpu.md (+ .json) and that section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from ssog_core.analysis.head_as_field import FIT_ATOMS, PATTERN_POINT, fit_atoms, measure_head_fields, patch_attention
from ssog_core.analysis.measures import attention_maps, export_maps_of
from ssog_core.checkpoint.files import replace_section, section_markers
from ssog_core.interventions.hooks import run_with_cache
from ssog_core.nn.config import standard_config
from ssog_core.nn.vit import ViT

from common import RESULTS, load_average, provenance, write_report

ROOT = Path(__file__).resolve().parent.parent
MARKS = section_markers("head-fields-bench")
TARGETS = {"maps": 1.5, "fields": 60.0, "memory_gb": 1.0}


def vit(dim: int, heads: int, size: int) -> ViT:
    """A timm-layout ViT /16 of 12 layers with a class token, random weights (seed 0)."""
    torch.manual_seed(0)
    cfg = standard_config("timm", img_size=(size, size), patch_size=16, dim=dim, depth=12, num_heads=heads,
                          num_classes=1000, mlp_hidden=4 * dim)  # fmt: skip
    return ViT(cfg).eval()


def images(n: int, size: int) -> torch.Tensor:
    return torch.rand(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def clocks(fn) -> tuple[float, float]:
    """Wall time and this process's CPU time (all threads) of ``fn()``: on a shared machine the wall clock also
    counts the other processes' time slices, the CPU time does not."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def time_small(repeats: int) -> dict[str, float]:
    """ViT-S/16 at 224²: one image's maps (medians), the fields over 64 images and the fit alone; wall and CPU."""
    model, grid = vit(384, 6, 224), (14, 14)
    one, batch = images(1, 224), images(64, 224).split(16)
    maps_t = [clocks(lambda: export_maps_of(attention_maps(model, one))) for _ in range(repeats + 1)][1:]
    got = []
    fields_t = clocks(lambda: got.append(measure_head_fields(model, lambda: iter(batch), FIT_ATOMS)))
    stats = got[0]
    names = [PATTERN_POINT.format(layer=i) for i in range(12)]
    with torch.no_grad():
        _, cache = run_with_cache(model, batch[0], names)
    mean = torch.cat([patch_attention(cache[n], grid, model.num_prefix_tokens)[0].mean(0) for n in names])
    fit_t = clocks(lambda: fit_atoms(mean, grid, FIT_ATOMS))
    return {"maps_s": statistics.median(t[0] for t in maps_t), "maps_cpu_s": statistics.median(t[1] for t in maps_t),
            "fields_s": fields_t[0], "fields_cpu_s": fields_t[1], "fit_s": fit_t[0], "fit_cpu_s": fit_t[1],
            "heads": int(stats.share_fit.numel())}  # fmt: skip


def _rss_kb() -> int:
    """The process's resident memory now, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def memory_child(keep: bool) -> dict[str, float]:
    """ViT-B/16 at 448², one image: peak RSS over the RSS before the forward pass, with every layer's pattern kept
    (``keep``) or none. Run in a fresh process, so the peak is this pass's."""
    model, x = vit(768, 12, 448), images(1, 448)
    names = [PATTERN_POINT.format(layer=i) for i in range(12)] if keep else []
    before = _rss_kb()
    start = time.perf_counter()
    with torch.no_grad():
        _, cache = run_with_cache(model, x, names)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kept = sum(t.numel() * t.element_size() for t in cache.values())
    return {"extra_gb": (peak - before) / 2**20, "kept_gb": kept / 2**30, "seconds": seconds,
            "before_gb": before / 2**20, "peak_gb": peak / 2**20}  # fmt: skip


def memory(threads: int) -> dict[str, dict[str, float]]:
    """:func:`memory_child` for both cases, each in its own process."""
    out = {}
    for case in ("patterns", "plain"):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", case, "--threads", str(threads)]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
        out[case] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def table(small: dict[str, float], mem: dict[str, dict[str, float]], threads: int, load: str, argv) -> str:
    command, when = provenance(argv)
    ok = lambda v, t: "met" if v <= t else "**missed**"  # noqa: E731
    p, q = mem["patterns"], mem["plain"]
    busy = load == "n/a" or float(load) >= 1.0
    shared = (
        "other processes were running, so wall times count their time slices too"
        if busy
        else "nothing else was running"
    )
    rows = [
        f"`{command}` — {when}, {threads} torch thread(s), wall clock, random weights; load average {load} at the "
        f"start ({shared}: absolute times are a guide only; CPU time is this process's, all threads).",
        "",
        "| what | measured: wall (CPU) | target, judged on CPU time (a bound on an idle machine's wall time) | |",
        "|---|---:|---:|---|",
        f"| ViT-S/16, 224², one image: attention + export maps (median) | {small['maps_s']:.2f} s "
        f"({small['maps_cpu_s']:.2f} s CPU) | ≤ {TARGETS['maps']} s | {ok(small['maps_cpu_s'], TARGETS['maps'])} |",
        f"| ViT-S/16, 224², 64 images: positional fields, shares and the 4-atom fit of all {small['heads']} heads "
        f"(two passes) | {small['fields_s']:.1f} s ({small['fields_cpu_s']:.1f} s CPU) | ≤ {TARGETS['fields']:.0f} s "
        f"| {ok(small['fields_cpu_s'], TARGETS['fields'])} |",
        f"| … of which the fit alone (72 heads, 14×14) | {small['fit_s']:.1f} s ({small['fit_cpu_s']:.1f} s CPU) | | |",
        f"| ViT-B/16, 448², one image: all 12 layers' patterns kept, peak extra RSS | {p['extra_gb']:.2f} GB "
        f"({p['kept_gb']:.2f} GB of patterns; {p['seconds']:.1f} s) | ≤ {TARGETS['memory_gb']:.0f} GB | "
        f"{ok(p['extra_gb'], TARGETS['memory_gb'])} |",
        f"| the same forward pass keeping nothing | {q['extra_gb']:.2f} GB ({q['seconds']:.1f} s) | | |",
    ]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", choices=("patterns", "plain"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(memory_child(args.child == "patterns")))
        return 0
    load = load_average()
    small = time_small(args.repeats)
    mem = memory(args.threads)
    text = table(small, mem, args.threads, load, argv)
    write_report(RESULTS / "head_fields_cpu.md", {"vit_s16_224": small, "vit_b16_448": mem}, text)
    block = "\n".join([MARKS[0], "### Heads as fields on standard ViTs", "", text.rstrip("\n"), MARKS[1]])
    replace_section(ROOT / "benchmarks" / "RESULTS.md", MARKS, block, before="<!-- GPU-RESULTS:BEGIN -->")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

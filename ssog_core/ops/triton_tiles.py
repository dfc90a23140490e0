"""Tile sizes of the fused SSOG kernels and the shared memory they need — plain integer arithmetic, no Triton
import, so that :mod:`ssog_core.ops.dispatch` can reject a shape before any kernel is built (and inside a
``torch.compile`` graph).

K of every 16-bit dot must be ≥ 16 (so KC·RP ≥ 16); the register and shared-memory tiles are bounded by
:data:`TILE_BUDGET` elements. ``python -m ssog_core.ops.triton_compile`` checks both against the compiled kernels.
"""

from __future__ import annotations

TILE_BUDGET = 16384  # elements of the largest register / shared-memory tile of a program
NUM_WARPS = 4  # the axial kernels (they still spill from 14×14 up: docs/KERNELS.md)
FACTORIZED_WARPS = 8  # the factorized kernels: no spills from 14×14 to 64×64 at d64, R4 (docs/KERNELS.md)
AXIAL_ATOM_SCRATCH = 384  # shared-memory bytes per atom and (key column, query row) of the axial column backward
# The steered forward takes half the query rows per program where that brings it to two or three programs per SM
# (≤ 128 registers at eight warps, no spills; sm_90 compiles of the benchmark shapes, docs/KERNELS.md §3): four or
# more atoms on grids up to 32 rows. False: the previous tiling (benchmarks/gpu_check.py times both).
STEERED_HALF_ROWS = True
# Four warps instead of eight for a factorized kernel at these tilings (GHP, GWP, DHP, RP) with 16-bit values: each
# thread then holds twice the tile, and where the sm_90 compile still fits it in ≤ 255 registers without spills, two
# programs share an SM where one did, and the cost report predicts the kernel ≥ 9% faster (the benchmark shapes, d64,
# bf16; docs/KERNELS.md §3). Elsewhere four warps spill or predict slower, and fp32 dots hold twice the operand
# registers. False: eight warps everywhere (benchmarks/gpu_check.py times both).
FOUR_WARPS = True
FOUR_WARP_TILES = {  # registers and programs per SM at eight → four warps, predicted µs per launch
    "fwd-steered": {(16, 16, 64, 2)},  # 14×14 R2: 155 → 217, 1 → 2, 56.8 → 48.9
    "fwd-fixed": set(),  # 14×14 R1 predicts 45.2 → 43.6: within the model's error for this kernel at two programs
    "bwd-rows": {(16, 16, 64, 1), (16, 16, 64, 2), (64, 64, 64, 4)},  # 14×14 R1 105.4 → 52.1, R2 64.3 → 55.1, 64×64 R4
    "bwd-cols": {(16, 16, 64, 4), (32, 32, 64, 4), (16, 16, 64, 8)},  # 14×14 R4, 32×32 R4 (COLS_ONE_IC), 14×14 R8
}
# ... where the column backward at four warps also takes 16/RP query rows per step instead of twice that: twice
# spills there (14×14 R4: 255 → 255 registers, 125.5 → 109.5 µs; 32×32 R4: 237 → 251, 1352.7 → 1199.1 µs; both
# 1 → 2 programs); at 14×14 R8 twice is faster (368.1 → 276.9 µs, against 301.9 with one IC).
COLS_ONE_IC = {(16, 16, 64, 4), (32, 32, 64, 4)}
FACTORIZED_STAGES = 2  # software-pipeline stages of the factorized kernels: each step's loads are copies issued at the
# end of the step before and waited for at the top of theirs (no overlap); three issue them a step earlier, which the
# calibrated cost model predicts slower at every benchmark shape (more copies and setup): docs/KERNELS.md §3


def p2(n: int, floor: int = 1) -> int:
    """The next power of two ≥ ``n`` (and ≥ ``floor``): Triton's tile sizes."""
    return max(floor, 1 << max(0, (n - 1).bit_length()))


def tiles(gh: int, gw: int, d: int, r: int, axial: bool) -> dict:
    """Tile sizes for one problem shape (constexprs of the forward and row-backward kernels): query rows per
    program ``T`` (fixed forward), ``TS`` (steered forward), ``TR`` (row backward)."""
    ro = 1 if axial else r
    rp = p2(ro)
    ghp, gwp, dhp = p2(gh, 16), p2(gw, 16), p2(d, 16)
    kc = max(1, 16 // rp)  # key columns per step: K = KC·RP of the row-pass dot
    jc = ghp  # key rows per column-pass dot (axial): the value tile [KC, JC, D]
    while jc > 16 and kc * jc * dhp > TILE_BUDGET:
        jc //= 2
    if axial:
        t = min(8, max(1, 16 // rp))  # query rows per program: M = T·RP of the column-pass dot
        while t > 1 and kc * t * rp * jc > TILE_BUDGET // 2:
            t //= 2
        wt = gwp  # query columns per program: the accumulator [T, WT, D]
        while wt > 16 and t * wt * dhp > TILE_BUDGET // 2:
            wt //= 2
        tr = t
    else:  # eight warps (kernel_warps) hold twice the tiles without spilling: more weights per thread
        t = min(8, max(1, 32 // rp))  # the column pass takes all key rows at once: the weight tile [KC, T·RP, GHP]
        while t > 1 and kc * t * rp * ghp > TILE_BUDGET:
            t //= 2
        wt = gwp
        while wt > 16 and t * wt * dhp > TILE_BUDGET:
            wt //= 2
        # the row backward keeps five running sums live across the column pass: half the rows for tall columns
        tr = t // 2 if t > 1 and kc * t * rp * ghp > TILE_BUDGET // 4 else t
    ts = t // 2 if STEERED_HALF_ROWS and not axial and t > 1 and rp >= 4 and ghp <= 32 else t
    return dict(R=r, RO=ro, RP=rp, GHP=ghp, GWP=gwp, DHP=dhp, T=t, TS=ts, TR=tr, KC=kc, JC=jc, WT=wt, D=d,
                EVEN_K=gw % kc == 0)  # fmt: skip


def kernel_warps(cfg: dict, kernel: str, value_bytes: int) -> int:
    """Warps per program of the factorized ``kernel`` (``fwd-steered``, ``fwd-fixed``, ``bwd-rows``, ``bwd-cols``)
    for the tiling ``cfg`` of :func:`tiles` and values of ``value_bytes`` bytes: four at :data:`FOUR_WARP_TILES`."""
    tiling = (cfg["GHP"], cfg["GWP"], cfg["DHP"], cfg["RP"])
    four = FOUR_WARPS and value_bytes == 2 and tiling in FOUR_WARP_TILES[kernel]
    return 4 if four else FACTORIZED_WARPS


def row_split(tokens: int, ghp: int, warps: int = FACTORIZED_WARPS) -> int:
    """Warps that share the key rows of one (token, atom) in a factorized column pass over ``tokens`` (token, atom)
    pairs: enough that the kernel's load of the per-token terms has one element per thread (Triton then keeps that
    load's layout, with the key rows within a thread), at most all ``ghp`` rows."""
    return max(1, min(ghp, warps * 32 // tokens))


def col_tiles(cfg: dict, axial: bool, warps: int = FACTORIZED_WARPS) -> tuple[int, int, int]:
    """Column-backward tiles for programs of ``warps`` warps: key columns per program (KT), query rows per step (IC,
    K = IC·RP of the dV dot must be ≥ 16) and query columns per dy1 step (WC)."""
    ic = max(1, 16 // cfg["RP"])
    if axial:
        kt = 4
        while kt > 1 and kt * cfg["GHP"] * cfg["DHP"] > TILE_BUDGET // 2:
            kt //= 2
    else:  # eight warps: twice the key columns, and twice the query rows where one step still takes every column
        kt = 2 * ic
        if 2 * ic * cfg["GWP"] * cfg["DHP"] <= TILE_BUDGET:
            ic *= 2
        # the fp32 register tiles dV [KT, GHP, DHP] and dy1 [IC, KT·RP, DHP] share one and a half budgets
        while kt > 1 and kt * (cfg["GHP"] + ic * cfg["RP"]) * cfg["DHP"] > 3 * TILE_BUDGET // 2:
            kt //= 2
        if warps == 4 and (cfg["GHP"], cfg["GWP"], cfg["DHP"], cfg["RP"]) in COLS_ONE_IC:
            ic = max(1, 16 // cfg["RP"])
    wc = cfg["GWP"]
    while wc > 16 and ic * wc * cfg["DHP"] > TILE_BUDGET:
        wc //= 2
    return kt, ic, wc


def shared_memory_estimate(gh: int, gw: int, d: int, r: int, axial: bool, dot_bytes: int) -> int:
    """An upper bound on the shared memory (bytes per program) of the largest kernel of this problem.

    Every dot stages its operands in shared memory (``dot_bytes`` per element); on top of that Triton multi-buffers
    the loads that feed a dot and borrows scratch for layout conversions. Those extras are modelled as a factor on
    the operand bytes, calibrated on sm_90 compiles (1.5 for the factorized kernels, which use at most 1.21× their
    operand bytes with two pipeline stages; 3 for the axial forward and row backward) and checked against every
    compiled kernel by ``python -m ssog_core.ops.triton_compile`` (tests/test_ops_triton.py). The axial column
    backward unrolls its per-atom gradients (``tl.static_range(R)``), each with its own fp32 scratch of
    :data:`AXIAL_ATOM_SCRATCH` bytes per (key column, query row) of a step, whatever the dot dtype: 24 KiB per atom
    at 14×14 and 32×32, 12 KiB at 64×64 (d64; 25.5 KiB at 9×1, d8, fp32, covered by the fixed part); its operands
    and a fixed part are modelled as ``0.75 × operand bytes + 48 KiB`` (sm_90 compiles from 9×1 to 64×64, d8 to
    d128, fp32 and 16-bit dots: within 3 KiB above the need at 14×14 with six atoms and at 9×1 with eight).
    """
    cfg = tiles(gh, gw, d, r, axial)
    kt, ic, wc = col_tiles(cfg, axial)
    kc, rp, dhp, ghp, wt = cfg["KC"], cfg["RP"], cfg["DHP"], cfg["GHP"], cfg["WT"]
    jc = cfg["JC"] if axial else ghp
    column = kc * jc * dhp  # the value tile of the column pass
    forward = kc * cfg["T"] * rp * jc + column + cfg["T"] * kc * rp * (wt + dhp)
    rows = kc * cfg["TR"] * rp * jc + column + cfg["TR"] * wt * dhp + cfg["TR"] * dhp * kc * rp
    cols = ic * kt * rp * wc + ic * wc * dhp + 2 * kt * ic * rp * dhp + kt * dhp * ghp + kt * ghp * ic * rp
    if not axial:
        return int(dot_bytes * 1.5 * max(forward, rows, cols)) + 8192
    atoms = r * AXIAL_ATOM_SCRATCH * kt * ic * rp
    return max(int(dot_bytes * 3.0 * max(forward, rows)) + 8192, int(dot_bytes * 0.75 * cols) + 49152 + atoms)

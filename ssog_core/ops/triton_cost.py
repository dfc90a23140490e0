"""A cost model of the compiled SSOG Triton kernels that runs without a GPU (docs/KERNELS.md §3).

From one compiled kernel (:func:`ssog_core.ops.triton_compile.compile_launch`) it reads

* the Triton IR (TTIR): every ``scf.for`` loop's trip count, evaluated from the launch's arguments, and the exact
  per-program work of each loop (``math.exp2`` lanes, ``tt.dot`` multiply-adds);
* the machine code (SASS, from Triton's bundled ``nvdisasm``): every loop's instructions, ``MUFU`` operations,
  tensor-core instructions (``HMMA``; ``HGMMA``, sm_90's ``wgmma``), barriers and shared-memory accesses per iteration.

Machine-code loops do not map one-to-one onto IR loops (the compiler unrolls and splits them), so each machine loop
is matched to the IR loop whose work it carries (same exponential and multiply-add content, up to a whole unroll
factor) and its trip count is anchored on that work: the group of machine loops of an IR loop runs as many times
as the IR loop's total work over the group's work per pass. Straight-line code runs once per program. That gives
each program's dynamic instruction mix, which :func:`kernel_time` turns into a time (model and constants below).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# ------------------------------------------------------------------------------ the H100 / H200 SM (sm_90)
# Per-SM limits: CUDA C++ Programming Guide, "Features and Technical Specifications", table "Technical
# Specifications per Compute Capability", column 9.0; allocation granularities: the CUDA Occupancy Calculator
# (cuda_occupancy.h, the values it uses for compute capability 9.0).
REGISTERS_PER_SM = 65536  # 32-bit registers per SM
SUB_PARTITIONS = 4  # warp schedulers per SM; the register file is split evenly between them
REGISTER_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256 (8 per thread)
MAX_WARPS_PER_SM = 64
MAX_PROGRAMS_PER_SM = 32  # resident thread blocks per SM
SHARED_PER_SM = 233472  # 228 KiB of shared memory per SM
SHARED_RESERVED_PER_PROGRAM = 1024  # the 1 KiB the driver reserves per resident block
SHARED_ALLOC_UNIT = 128  # shared memory is allocated in 128-byte units

# Per-SM throughput per clock: CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table, column 9.0
# (128 fp32 add/multiply/FMA lanes; 16 lanes of reciprocal, square root, base-2 exponential and logarithm: MUFU),
# one warp-instruction issued per scheduler per clock; shared memory delivers 32 banks × 4 bytes (one wavefront)
# per clock; the tensor cores 2048 dense bf16 multiply-adds (H100 SXM5 whitepaper: 989.4 TFLOP/s dense BF16 =
# 132 SMs × 1830 MHz × 2048 × 2), a ceiling the kernels' mma.sync does not exceed.
ISSUE_PER_CLOCK = SUB_PARTITIONS  # warp-instructions
FP32_LANES_PER_CLOCK = 128
MUFU_LANES_PER_CLOCK = 16
SHARED_WAVEFRONTS_PER_CLOCK = 1
TENSOR_MACS_PER_CLOCK = 2048
WARP = 32

# The measured machine: NVIDIA H200 SXM (132 SMs, `nvidia-smi -q` max SM clock 1980 MHz, HBM3e 4.8 TB/s: the H200
# datasheet). The H100 SXM has the same SM and clocks with 3.35 TB/s.
SMS = 132
CLOCK_HZ = 1.98e9
HBM_BYTES_PER_S = 4.8e12

# --------------------------------------------------------------------------------------------- occupancy


def programs_per_sm(regs: int, shared: int, warps: int) -> tuple[int, str]:
    """Programs (thread blocks) of one kernel resident on an SM, and the resource that limits them (the CUDA
    occupancy calculator's rules: registers per warp rounded up to the allocation unit, each scheduler's quarter
    of the register file holding whole warps; shared memory plus the reserved kilobyte per program in allocation
    units; the warp and block limits)."""
    per_warp = -(-max(regs, 1) * WARP // REGISTER_ALLOC_UNIT) * REGISTER_ALLOC_UNIT
    warps_by_regs = (REGISTERS_PER_SM // SUB_PARTITIONS // per_warp) * SUB_PARTITIONS
    shared_unit = -(-(shared + SHARED_RESERVED_PER_PROGRAM) // SHARED_ALLOC_UNIT) * SHARED_ALLOC_UNIT
    limits = {
        "registers": warps_by_regs // warps,
        "shared memory": SHARED_PER_SM // shared_unit,
        "warps": MAX_WARPS_PER_SM // warps,
        "programs": MAX_PROGRAMS_PER_SM,
    }
    binding = min(limits, key=lambda k: limits[k])
    return limits[binding], binding


# ------------------------------------------------------------------------------------------------ the IR


@dataclass
class IRLoop:
    """One ``scf.for`` of the TTIR: its total iterations per program (outer loops included) and its own work per
    iteration (nested loops excluded)."""

    trips: int
    exp2: int = 0  # math.exp2 lanes per iteration
    macs: int = 0  # tt.dot multiply-adds per iteration

    @property
    def signature(self) -> tuple[int, int]:
        return self.exp2, self.macs


_INT_OP = re.compile(r"^\s*(%[\w.$-]+) = arith\.(\w+) (.*?) : (?:i32|i64|index)\b")
_FOR = re.compile(r"scf\.for %[\w.$-]+ = (%[\w.$-]+) to (%[\w.$-]+) step (%[\w.$-]+)")
_ARG = re.compile(r"(%[\w.$-]+): i(?:32|64)\b")
_TENSOR = re.compile(r"tensor<([\dx]+)x\w+>")
_BINARY = {
    "addi": lambda a, b: a + b,
    "subi": lambda a, b: a - b,
    "muli": lambda a, b: a * b,
    "divsi": lambda a, b: int(a / b),
    "divui": lambda a, b: a // b,
    "ceildivsi": lambda a, b: -(-a // b),
    "remsi": lambda a, b: int(math.fmod(a, b)),
    "remui": lambda a, b: a % b,
    "maxsi": max,
    "minsi": min,
}


def _numel(dims: str) -> int:
    return math.prod(int(d) for d in dims.split("x"))


def ir_loops(ttir: str, args: dict[str, int]) -> tuple[list[IRLoop], IRLoop]:
    """The loops of a TTIR function in program order, and its straight-line work (``trips`` 1). ``args``: the
    launch's integer arguments by name (the TTIR names its function arguments after the kernel's)."""
    env: dict[str, int] = {}
    head = ttir[ttir.index("tt.func") :].split("\n", 1)[0]
    for name in _ARG.findall(head):
        if name[1:] in args:
            env[name] = args[name[1:]]

    def value(name: str) -> int:
        if name not in env:
            raise ValueError(f"loop bound {name} is not an integer computed from the launch arguments")
        return env[name]

    straight, loops, stack = IRLoop(1), [], []  # stack: the open regions, a loop or None
    for line in ttir[ttir.index("tt.func") :].splitlines()[1:]:
        here = next((s for s in reversed(stack) if s is not None), straight)
        if m := _INT_OP.match(line):
            op, rest = m.group(2), m.group(3)
            if op == "constant":
                env[m.group(1)] = int(rest.split()[0].removesuffix(":"))
            elif op in _BINARY:
                a, b = (s.strip() for s in rest.split(","))
                if a in env and b in env:
                    env[m.group(1)] = _BINARY[op](env[a], env[b])
            elif op in ("extsi", "extui", "trunci", "index_cast") and rest.split()[0] in env:
                env[m.group(1)] = env[rest.split()[0]]
        elif "math.exp2" in line:
            t = _TENSOR.findall(line.rsplit(":", 1)[-1])
            here.exp2 += _numel(t[0]) if t else 1
        elif "tt.dot " in line:
            a, b = _TENSOR.findall(line.split("->")[0].rsplit(":", 1)[-1])[:2]
            here.macs += _numel(a) * int(b.split("x")[-1])
        opened = line.count("{") - line.count("}")
        if opened > 0:
            if m := _FOR.search(line):
                lo, hi, step = (value(g) for g in m.groups())
                loop = IRLoop(here.trips * max(0, -(-(hi - lo) // step)))
                loops.append(loop)
                stack.append(loop)
            else:
                stack.append(None)
        elif opened < 0:
            if not stack:
                break  # the end of the function
            stack.pop()
    return loops, straight


# ---------------------------------------------------------------------------------------------- the SASS

# an opcode and its modifiers; HGMMA's shape is written in lower case (HGMMA.64x16x16.F32.BF16)
_INSTR = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*(?:x[0-9A-Z_.]+)*)")
_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")
_HMMA = re.compile(r"HMMA\.(16)(8)(8|16)\b")
_HGMMA = re.compile(r"HGMMA\.(\d+)x(\d+)x(\d+)\b")  # sm_90 wgmma: one instruction of a warp group (4 warps)
WARP_GROUP = 4
_SHARED_BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}  # per lane; no suffix: 4


@dataclass
class Mix:
    """Per-thread instruction counts of a stretch of SASS (per warp, they are warp-instructions)."""

    instr: float = 0
    ex2: float = 0
    mufu: float = 0  # every MUFU operation (EX2, RCP, ...): they share the unit
    hmma_macs: float = 0  # multiply-adds of the warp's HMMA (and its part of HGMMA) instructions, per warp
    barriers: float = 0
    global_accesses: float = 0  # global-memory load and store instructions (LDG, LDGSTS, STG)
    shared_bytes: float = 0  # per warp
    shared_wavefronts: float = 0  # 128-byte shared-memory transactions per warp, no bank conflicts assumed
    spill_bytes: float = 0
    # where a loop's global loads are waited for (:func:`load_waits`): in the iteration that issued them, or in a
    # later one (issued ahead), and of those the loads with at least half the loop's instructions between issue and
    # wait (overlapped: the uncalibrated reading of :func:`overlapped_cycles` does not charge them)
    loads_same_iteration: float = 0
    loads_ahead: float = 0
    loads_overlapped: float = 0
    # shared-memory stores: single 8/16/32-bit (STS.U8, STS.U16, STS) and vector (STS.64, STS.128, STSM)
    stores_narrow: float = 0
    stores_vector: float = 0

    def add(self, other: Mix, times: float = 1.0) -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + times * getattr(other, k))

    def scaled(self, times: float) -> Mix:
        out = Mix()
        out.add(self, times)
        return out


def _count(op: str, mix: Mix) -> None:
    mix.instr += 1
    parts = op.split(".")
    if parts[0] == "MUFU":
        mix.mufu += 1
        mix.ex2 += op == "MUFU.EX2"
    elif m := _HMMA.match(op):
        mix.hmma_macs += math.prod(int(g) for g in m.groups())  # m·n·k of one warp's instruction
    elif m := _HGMMA.match(op):  # every warp of the group issues it: a quarter of its m·n·k each
        mix.hmma_macs += math.prod(int(g) for g in m.groups()) / WARP_GROUP
    elif op.startswith("BAR.SYNC") or op == "BAR.RED":
        mix.barriers += 1
    if parts[0] in ("LDG", "LDGSTS", "STG"):
        mix.global_accesses += 1
    if parts[0] == "STSM" or (parts[0] == "STS" and ("64" in parts or "128" in parts)):
        mix.stores_vector += 1
    elif parts[0] == "STS":
        mix.stores_narrow += 1
    if parts[0] in ("LDSM", "STSM"):  # 8×8 16-bit matrices: .2 / .4 two or four of them
        n = int(parts[-1]) if parts[-1].isdigit() else 1
        mix.shared_bytes += 128 * n
        mix.shared_wavefronts += n
    elif parts[0] in ("LDS", "STS", "LDGSTS", "ATOMS"):  # LDGSTS writes shared memory (its global read aside)
        width = next((_SHARED_BYTES[p] for p in parts[1:] if p in _SHARED_BYTES), 4)
        mix.shared_bytes += WARP * width
        mix.shared_wavefronts += max(1, WARP * width // 128)
    elif parts[0] == "STL":
        mix.spill_bytes += next((_SHARED_BYTES[p] for p in parts[1:] if p in _SHARED_BYTES), 4)


_CONTROL = re.compile(r"^\s+/\* (0x[0-9a-f]{16}) \*/\s*$")
_DEPBAR = re.compile(r"\bDEPBAR\.LE SB0, (0x[0-9a-f]+)")


def _control(lines: list[str], n: int) -> tuple[int, int] | None:
    """The write scoreboard and the wait mask of the instruction on line ``n`` from its control bits (the second
    64-bit word ``nvdisasm -hex`` prints on the next line: bits 46–48 the scoreboard an instruction of variable
    latency releases when done, 7 for none; bits 52–57 the scoreboards it waits for first), or ``None`` without
    ``-hex``."""
    m = _CONTROL.match(lines[n + 1]) if n + 1 < len(lines) else None
    if not m:
        return None
    word = int(m.group(1), 16)
    return (word >> 46) & 7, (word >> 52) & 0x3F


def load_waits(lines: list[str], body: list[tuple[int, str]]) -> list[tuple[int, bool, int]]:
    """Each global load (``LDG``, ``LDGSTS``) of a loop's ``body`` (its instructions as ``(line, opcode)``): its
    line, whether it is waited for after the loop's back edge (issued ahead, for a later iteration) and the
    instructions issued between it and its wait, following the loop around once (a load not waited for within one
    pass counts as a whole pass ahead).

    An ``LDG`` is waited for by the first later instruction whose wait mask holds the load's scoreboard (the control
    bits of ``nvdisasm -hex``; without them every ``LDG`` counts as waited for at once). An ``LDGSTS`` belongs to
    the group the next ``LDGDEPBAR`` commits and is waited for by the first ``DEPBAR.LE SB0, N`` reached after at
    least ``N`` later groups were committed."""
    out = []
    for i, (n, op) in enumerate(body):
        kind = op.split(".")[0]
        if kind not in ("LDG", "LDGSTS"):
            continue
        ctl = _control(lines, n)
        after = body[i + 1 :] + body[: i + 1]  # around the loop once
        wait, committed = None, -1  # committed: groups committed after this copy's own (-1: not yet its own)
        for step, (m, later) in enumerate(after):
            if kind == "LDG":
                here = _control(lines, m)
                if ctl is None or ctl[0] == 7 or (here is not None and here[1] >> ctl[0] & 1):
                    wait = step
                    break
            elif later == "LDGDEPBAR":
                committed += 1
            elif (d := _DEPBAR.search(lines[m])) and committed >= int(d.group(1), 16):
                wait = step
                break
        ahead = wait is None or wait >= len(body) - 1 - i
        out.append((n, ahead, len(body) if wait is None else wait))
    return out


@dataclass
class SassLoop:
    first: int
    last: int
    own: Mix = field(default_factory=Mix)  # instructions not inside a nested loop, per pass


def sass_loops(sass: str) -> tuple[list[SassLoop], Mix]:
    """The loops of ``nvdisasm -c`` output in code order (a backward branch closes one; the trap loop after
    ``EXIT`` is not a loop) with their own instruction mix per pass, and the straight-line mix."""
    lines = sass.splitlines()
    labels = {line[:-1]: n for n, line in enumerate(lines) if line.startswith(".L_x_") and line.endswith(":")}
    ops = [(n, m.group(1)) for n, line in enumerate(lines) if (m := _INSTR.match(line)) and m.group(1) != "NOP"]
    loops, traps = [], set()
    for n, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and labels.get(m.group(1), n + 1) < n:
            first = labels[m.group(1)]
            if sum(first <= k <= n for k, _ in ops) > 1:
                loops.append(SassLoop(first, n))
            else:
                traps.add(n)  # a branch to itself: never executed
    ops = [(n, op) for n, op in ops if n not in traps]
    loops.sort(key=lambda lp: lp.first)
    straight = Mix()
    for n, op in ops:
        inside = [lp for lp in loops if lp.first <= n <= lp.last]
        _count(op, min(inside, key=lambda lp: lp.last - lp.first).own if inside else straight)
    for lp in loops:
        body = [(n, op) for n, op in ops if lp.first <= n <= lp.last]
        for n, ahead, distance in load_waits(lines, body):
            if min((x for x in loops if x.first <= n <= x.last), key=lambda x: x.last - x.first) is lp:
                lp.own.loads_ahead += ahead
                lp.own.loads_same_iteration += not ahead
                lp.own.loads_overlapped += ahead and 2 * distance >= len(body)
    return loops, straight


# -------------------------------------------------------------------------------------- IR ↔ SASS matching


@dataclass
class KeyLoop:
    """The IR loop with the most work, as the machine runs it: per IR iteration."""

    trips: int
    sass_per_ex2: float | None  # SASS instructions per MUFU.EX2 in its machine loops
    per_iteration: Mix  # per thread


@dataclass
class Dynamic:
    per_thread: Mix  # one program's dynamic instruction mix, per thread (per warp: warp-instructions)
    key: KeyLoop | None
    unmatched: list[str]  # what could not be anchored (then the counts are lower bounds)


def dynamic_mix(loops: list[IRLoop], ir_straight: IRLoop, sass: list[SassLoop], straight: Mix, warps: int) -> Dynamic:
    """One program's dynamic SASS mix. Where the machine code has as many loops with work (exponentials or
    ``HMMA``) as the IR, they pair in program order and each runs its IR loop's trips (a replicated layout may
    compute more exponential lanes than the IR asks for: that is real work). Otherwise (unrolled and split loops)
    each machine loop joins the first IR loop, in order from the last match, whose exponential lanes (else
    multiply-adds) per iteration divide its own by a whole unroll factor, and a group runs (IR loop's total work)
    / (group's work per pass) times. Loops without work join the current group. Exponentials in straight-line code
    beyond the IR's straight-line ones are iterations the compiler peeled: they come off the trips of the IR loop
    with the most exponentials."""
    threads = warps * WARP
    peeled = max(0.0, straight.ex2 * threads - ir_straight.exp2)
    most = max(range(len(loops)), key=lambda j: loops[j].trips * loops[j].exp2, default=None)
    busy_ir = [j for j, lp in enumerate(loops) if lp.signature != (0, 0)]
    busy_sass = [lp for lp in sass if lp.own.ex2 or lp.own.hmma_macs]
    paired = len(busy_ir) == len(busy_sass)
    groups: dict[int, list[SassLoop]] = {}
    unmatched, i = [], busy_ir[0] if busy_ir else 0
    for lp in sass:
        work = (lp.own.ex2 * threads, lp.own.hmma_macs * warps)
        if work == (0, 0):
            groups.setdefault(i, []).append(lp)
            continue
        if paired:
            i = busy_ir[busy_sass.index(lp)]
            groups.setdefault(i, []).append(lp)
            continue
        for j in range(i, len(loops)):
            if loops[j].signature != (0, 0) and _ratio(work, loops[j].signature):
                i = j
                groups.setdefault(j, []).append(lp)
                break
        else:
            unmatched.append(f"machine loop at line {lp.first} (exp2 {work[0]}, MACs {work[1]})")
    total = Mix()
    total.add(straight)
    key, best = None, -1.0
    for j, members in groups.items():
        ir = loops[j] if j < len(loops) else None
        per_pass = Mix()
        for lp in members:
            per_pass.add(lp.own)
        if ir is None or ir.signature == (0, 0):
            unmatched.append(f"machine loops at lines {[lp.first for lp in members]} without IR work to anchor on")
            continue
        lanes = per_pass.ex2 * threads
        if paired:  # a whole ratio of both kinds of work is an unrolled body; anything else a replicated layout
            u = _ratio((lanes, per_pass.hmma_macs * warps), ir.signature)
            passes = ir.trips / (u or 1)
        else:
            anchor = (lanes, ir.exp2) if ir.exp2 else (per_pass.hmma_macs * warps, ir.macs)
            passes = ir.trips * anchor[1] / anchor[0]
        if j == most and lanes and peeled:
            passes -= peeled / lanes
        total.add(per_pass, passes)
        work = ir.trips * (ir.exp2 + ir.macs)
        if work > best and ir.trips:
            best = work
            per_iter = per_pass.scaled(passes / ir.trips)
            key = KeyLoop(ir.trips, per_pass.instr / per_pass.ex2 if per_pass.ex2 else None, per_iter)
    for j in busy_ir:
        if j not in groups and loops[j].trips:
            unmatched.append(
                f"IR loop {j} (exp2 {loops[j].exp2}, MACs {loops[j].macs} per iteration) has no machine loop"
            )
    return Dynamic(total, key, unmatched)


def _ratio(work: tuple[float, float], ir: tuple[int, int]) -> int | None:
    """The whole number u ≥ 1 of IR iterations a machine loop's work per pass holds (both kinds of work), or None."""
    pairs = list(zip(work, ir, strict=True))
    if any(bool(w) != bool(r) for w, r in pairs):
        return None
    ratios = {w / r for w, r in pairs if r}
    u = ratios.pop() if len(ratios) == 1 else 0
    return int(u) if u >= 1 and u == int(u) else None


# ------------------------------------------------------------------------------------------- time model


@dataclass
class Calibration:
    """The fitted constants of :func:`kernel_time`'s latency bound: the cycles one warp takes per instruction and,
    on top, per global-memory access instruction (``LDG``, ``LDGSTS``, ``STG``) when nothing else is the bound —
    an empirical split of its stalls (dependent arithmetic, barriers; memory latency that is not hidden)."""

    cycles_per_instruction: float
    cycles_per_global_access: float


# Fitted (``python -m ssog_core.ops.triton_compile --report --fit``, commit 474e441) on the 12 H200 rows of
# benchmarks/results/gpu_ops_cuda.csv against the kernels that run measured (those of commit f70cf68). Kept fixed,
# so that a change to the kernels is predicted with the constants of the machine's behaviour, not refitted to the
# old times; refit only on rows measured from the kernels being compiled.
H200_CALIBRATION = Calibration(cycles_per_instruction=2.1288, cycles_per_global_access=588.21)


def wave_cycles(mix: Mix, warps: int, programs_per_sm: int, cal: Calibration) -> dict[str, float]:
    """Cycles one wave of ``programs_per_sm`` programs takes on an SM, by bound: what the SM's issue slots,
    MUFU, tensor cores and shared memory need for all of them, and the latency of one warp's instruction
    stream (its instructions and global-memory accesses × the calibrated cycles of each)."""
    n = programs_per_sm * warps  # resident warps
    return {
        "issue": n * mix.instr / ISSUE_PER_CLOCK,
        "MUFU": n * mix.mufu * WARP / MUFU_LANES_PER_CLOCK,
        "tensor": n * mix.hmma_macs / TENSOR_MACS_PER_CLOCK,
        "shared": n * mix.shared_wavefronts / SHARED_WAVEFRONTS_PER_CLOCK,
        "latency": mix.instr * cal.cycles_per_instruction + mix.global_accesses * cal.cycles_per_global_access,
    }


def overlapped_time(
    mix: Mix, warps: int, programs: int, per_sm: int, hbm_bytes: int, cal: Calibration
) -> tuple[float, str]:
    """An uncalibrated reading beside :func:`kernel_time`, not a prediction: the same bounds with the latency term
    not charging the loads issued at least half a loop iteration ahead of their wait (``Mix.loads_overlapped``).
    CPG was fitted on kernels none of whose loads was (every loop's copies waited for at the top of the next
    iteration, right after their issue at the end of this one), so what it charges for an access that does overlap
    work is unknown; this is the time if such a load cost nothing."""
    hidden = Mix(**(vars(mix) | {"global_accesses": mix.global_accesses - mix.loads_overlapped}))
    return kernel_time(hidden, warps, programs, per_sm, hbm_bytes, cal)


def kernel_time(
    mix: Mix, warps: int, programs: int, per_sm: int, hbm_bytes: int, cal: Calibration
) -> tuple[float, str]:
    """Predicted seconds of one launch and the bound that sets it:
    ``max(waves × max(issue, MUFU, tensor, shared, latency) cycles / clock, HBM bytes / bandwidth)`` with
    ``waves = ⌈programs / (SMs × programs per SM)⌉``."""
    bounds = wave_cycles(mix, warps, per_sm, cal)
    binding = max(bounds, key=lambda k: bounds[k])
    waves = -(-programs // (SMS * per_sm))
    t = waves * bounds[binding] / CLOCK_HZ
    hbm = hbm_bytes / HBM_BYTES_PER_S
    return (t, binding) if t >= hbm else (hbm, "HBM")


# ------------------------------------------------------------------ throughput ceilings of three tilings


@dataclass(frozen=True)
class Ceiling:
    """One design's forward work per (image, head) and the SM clocks its busiest unit needs for it."""

    design: str
    tensor_macs: int  # tensor-core multiply-adds
    exponentials: int  # MUFU.EX2 lanes
    fp32_lanes: int  # fp32 add / multiply / FMA lanes outside the tensor cores

    @property
    def clocks(self) -> float:
        """The throughput bound: the busiest of tensor cores, MUFU and fp32 lanes, with perfect overlap."""
        return max(self.tensor_macs / TENSOR_MACS_PER_CLOCK, self.exponentials / MUFU_LANES_PER_CLOCK,
                   self.fp32_lanes / FP32_LANES_PER_CLOCK)  # fmt: skip

    @property
    def binding(self) -> str:
        units = {"tensor": self.tensor_macs / TENSOR_MACS_PER_CLOCK, "MUFU": self.exponentials / MUFU_LANES_PER_CLOCK,
                 "fp32": self.fp32_lanes / FP32_LANES_PER_CLOCK}  # fmt: skip
        return max(units, key=lambda k: units[k])


WEIGHT_FP32_OPS = 3  # per SSOG kernel weight besides its exp2: e·(ca·e + cb) and the 1/Z scale (docs/KERNELS.md §1)
SOFTMAX_FP32_OPS = 2  # per score of SDPA besides its exp2: the scaled max subtraction and the row sum


def ceilings(grid: tuple[int, int], atoms: int, head_dim: int) -> list[Ceiling]:
    """The forward pass's throughput ceilings, per (image, head), of

    * ``sdpa``: FlashAttention (``Q·Kᵀ`` and ``P·V`` on the tensor cores, one exponential per score);
    * ``dense SSOG tile``: the separable factors of the steered field built per query (the same exponentials as
      the factorized kernels, without the ``Z_x`` prologue), the dense weight of every (query, key) pair formed as
      ``Σ_r λ_r·P_r·A_r`` (``R`` FMAs on the fp32 lanes), then one 2-D ``W·V`` dot per tile (the
      FlashAttention-style alternative, which could use ``wgmma``);
    * ``factorized``: today's kernels (column pass, row pass and the ``Z_x`` prologue, docs/KERNELS.md §1–§2).

    What a tiling can reach at best, not a prediction: the kernels today are latency-bound far below it (§3)."""
    gh, gw = grid
    n, r, d = gh * gw, atoms, head_dim
    weights = r * n * (gh + gw)  # column pass: Gh per (token, atom); row pass: Gw per (query, atom)
    return [
        Ceiling("sdpa", 2 * n * n * d, n * n, SOFTMAX_FP32_OPS * n * n),
        Ceiling("dense SSOG tile", n * n * d + weights * d, weights, r * n * n + WEIGHT_FP32_OPS * weights),
        Ceiling("factorized", weights * d, weights + r * n * gw, WEIGHT_FP32_OPS * (weights + r * n * gw)),
    ]


def ceilings_table(grids: list[tuple[int, int]], atoms: list[int], head_dim: int, pairs: int) -> list[str]:
    """Markdown: each design's ceiling for ``pairs`` (image, head) pairs spread over every SM of the measured H200
    (ms, and the unit that binds), and SDPA's ceiling over it."""

    def ms(c: Ceiling) -> str:
        return f"{c.clocks * pairs / SMS / CLOCK_HZ * 1e3:.4f} ({c.binding})"

    lines = [
        "| grid (tokens) | R | sdpa ms | dense SSOG tile ms | sdpa ÷ it | factorized ms | sdpa ÷ it |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for grid in grids:
        for r in atoms:
            sdpa, dense, fact = ceilings(grid, r, head_dim)
            lines.append(
                f"| {grid[0]}×{grid[1]} ({grid[0] * grid[1]}) | {r} | {ms(sdpa)} | {ms(dense)} | "
                f"**{sdpa.clocks / dense.clocks:.2f}** | {ms(fact)} | **{sdpa.clocks / fact.clocks:.2f}** |"
            )
    return lines

"""Checks of the fused RBF Triton kernels, run in a child process by tests/test_rbf_triton.py.

``python -m tests.rbf_triton_checks GROUP`` with GROUP one of:

* ``fp32``, ``half``, ``compile`` — under ``TRITON_INTERPRET=1`` (the parent sets it; it must be set before
  Triton is imported, and a child process keeps it from leaking into other test modules under xdist):
  forward and gradients against the float64 dense oracle, module parity, ``opcheck`` and
  ``torch.compile``;
* ``sm90`` — without the interpreter: compile the kernels for an sm_90 GPU (no GPU needed) and read the
  register / stack use of the cubin with Triton's bundled ``cuobjdump``.

Each check prints one line; any failure raises, so the exit status is the verdict.
"""

from __future__ import annotations

import os
import sys

import torch

from tests.rbf_oracle import rbf_weights


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def compare(case: str, q, k, v, causal: bool, tol_of) -> None:
    """Kernel forward and grads vs the float64 oracle on the same (rounded) inputs.

    ``tol_of(name, err_torch)`` gives the allowed relative error, given the torch path's own error
    at the input dtype (so low-precision tolerances follow the dtype, as flash-attention's tests do).
    """
    from ssog_core.ops.dispatch import rbf_attention
    from ssog_core.ops.rbf_torch import rbf_attention_torch

    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = rbf_attention(q, k, v, causal, backend="triton")
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    out_t = rbf_attention_torch(q, k, v, causal)
    grads_t = torch.autograd.grad(out_t, (q, k, v), do)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = rbf_weights(qd, kd, causal) @ vd
    refs = torch.autograd.grad(ref, (qd, kd, vd), do.double())
    report = []
    results = zip(("o", "dq", "dk", "dv"), (out, *grads), (out_t, *grads_t), (ref, *refs), strict=True)
    for name, got, via_torch, want in results:
        assert got.dtype == q.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        err, err_t = rel_err(got, want.detach()), rel_err(via_torch, want.detach())
        tol = tol_of(name, err_t)
        report.append(f"{name} {err:.1e}/{tol:.1e}")
        assert err <= tol, f"{case}: {name} relative error {err:.2e} > {tol:.2e} (torch path {err_t:.2e})"
    print(f"ok {case}: " + ", ".join(report), flush=True)


def check_fp32() -> None:
    from ssog_core.nn.attention import RBFAttention

    torch.manual_seed(0)
    cases = [  # (B, H, N, D, causal, scale): ragged lengths, sub-tile lengths, big keys
        (1, 2, 37, 16, False, 1.0),
        (1, 2, 37, 16, True, 1.0),
        (2, 1, 61, 24, False, 1.0),
        (2, 1, 61, 24, True, 1.0),
        (1, 1, 5, 24, True, 1.0),
        (1, 1, 33, 16, False, 4.0),
    ]
    for b, h, n, d, causal, scale in cases:
        q, k, v = (torch.randn(b, h, n, d) * s for s in (scale, scale, 1.0))
        compare(
            f"fp32 B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} x{scale:g}", q, k, v, causal, lambda *_: 2e-5
        )
    # non-contiguous inputs, as the attention modules produce them ((B, N, H, D) memory, transposed)
    q, k, v = (torch.randn(1, 29, 2, 16).transpose(1, 2) for _ in range(3))
    assert not q.is_contiguous()
    compare("fp32 non-contiguous N29 D16", q, k, v, True, lambda *_: 2e-5)
    # path parity through the module: the same weights with each backend
    torch.manual_seed(1)
    attn = RBFAttention(48, 2, susie="1d", susie_dim=8, causal=True, backend="triton")
    x = torch.randn(2, 1 + 37, 48)
    y = attn(x, (1, 37))
    attn.backend = "torch"
    err = rel_err(y, attn(x, (1, 37)).double().detach())
    assert err < 2e-5, err
    print(f"ok module parity triton vs torch: {err:.1e}", flush=True)


def check_half() -> None:
    torch.manual_seed(0)

    def tol(name: str, err_torch: float) -> float:  # at most twice the torch path's own error, plus a floor
        return 2 * err_torch + 2e-3

    for dtype, n, d, causal in ((torch.float16, 37, 16, True), (torch.float16, 61, 24, False),
                                (torch.bfloat16, 61, 24, True), (torch.bfloat16, 37, 16, False)):  # fmt: skip
        q, k, v = (torch.randn(1, 2, n, d).to(dtype) for _ in range(3))
        compare(f"{str(dtype)[6:]} N{n} D{d} {'causal' if causal else 'full'}", q, k, v, causal, tol)


def check_compile() -> None:
    from ssog_core.ops.rbf_triton import rbf_attention_triton, rbf_bwd, rbf_fwd

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 21, 16, requires_grad=True) for _ in range(3))
    for causal in (False, True):
        torch.library.opcheck(rbf_fwd, (q, k, v, causal))
        o, lse = rbf_fwd(q, k, v, causal)
        inputs = (q, k, v, o, lse, torch.randn_like(o))  # the backward op is not differentiable (no double backward)
        torch.library.opcheck(rbf_bwd, (*(t.detach() for t in inputs), causal))
    print("ok opcheck fwd/bwd (schema, fake tensors, autograd registration, aot dispatch)", flush=True)

    def loss(q, k, v):
        return (rbf_attention_triton(q, k, v, True) * torch.linspace(-1, 1, 16)).sum()

    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-7)
    print("ok torch.compile(fullgraph=True) forward + backward through the custom ops", flush=True)


def check_sm90() -> None:
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ssog_core.ops import rbf_triton as rt

    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    kernels = {"fwd": [rt._rbf_fwd_kernel], "bwd": [rt._rbf_bwd_dkdv_kernel, rt._rbf_bwd_dq_kernel]}
    for dtype, d in ((torch.bfloat16, 64),):  # the training path (one dtype: each compile takes seconds)
        q = torch.empty(1, 1, 1, d, dtype=dtype, device="meta")
        ty = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
        for kind, kerns in kernels.items():
            params = rt.launch_params(q, kind)
            options = {"num_warps": params.pop("num_warps"), "num_stages": params.pop("num_stages")}
            consts = dict(params, CAUSAL=True)
            for kern in kerns:
                sig = {}
                for name in kern.arg_names:
                    if name in consts:
                        sig[name] = "constexpr"
                    elif name == "N":
                        sig[name] = "i32"
                    elif name in ("qk_scale", "kn_scale", "two_gamma"):
                        sig[name] = "fp32"
                    else:
                        sig[name] = "*fp32" if name in ("LSE", "DELTA") else f"*{ty}"
                compiled = triton.compile(
                    ASTSource(kern, sig, consts), target=GPUTarget("cuda", 90, 32), options=options
                )
                ptx = compiled.asm["ptx"]
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(compiled.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([cuobjdump, "--dump-resource-usage", f.name], capture_output=True, text=True)
                m = re.search(r"REG:(\d+) STACK:(\d+)", usage.stdout)
                assert m, usage.stdout + usage.stderr
                regs, stack = int(m[1]), int(m[2])
                mma = "wgmma" if "wgmma" in ptx else "mma" if "mma.sync" in ptx else "fma"
                print(f"ok sm_90 {ty} D{d} {kern.fn.__name__}: {regs} registers, stack {stack} B, {mma}", flush=True)
                assert mma == "wgmma" and stack == 0, (kern.fn.__name__, regs, stack, mma)  # tensor cores, no spills


GROUPS = {"fp32": check_fp32, "half": check_half, "compile": check_compile, "sm90": check_sm90}

if __name__ == "__main__":
    group = sys.argv[1]
    interpreted = group != "sm90"
    if (os.environ.get("TRITON_INTERPRET") == "1") != interpreted:
        sys.exit(f"group {group} needs TRITON_INTERPRET={'1' if interpreted else 'unset'} before Triton is imported")
    GROUPS[group]()

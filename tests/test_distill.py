"""``python -m ssog_core distill``: the student of a dot-attention ViT (its heads' fitted fields, steered by content),
its training against the teacher's logits and its report (docs/DESIGN.md §2.5). The teachers are trained here: a
lab dot model and transformers' ViTForImageClassification written as a folder, on pictures the tests make."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ssog_core.analysis.head_as_field import fit_layers, mean_attention
from ssog_core.checkpoint.format import load_checkpoint, save_checkpoint
from ssog_core.cli.distill import main as distill_main
from ssog_core.cli.fields import main as fields_main
from ssog_core.cli.info import main as info_main
from ssog_core.distill.loop import ROW_FLOOR, RowCross, attention_inputs, rows_loss, teacher_rows
from ssog_core.distill.student import STUDENT_SIGMA_FLOOR, build_student, steering_parameters, student_config
from ssog_core.interventions.validation import MAX_EVAL_IMAGES, pictures_for
from ssog_core.nn.attention import SSOGAttention
from ssog_core.nn.vit import ViT
from ssog_core.testing.oracles import oracle_matrix
from tests.helpers import weights

SIZE = (28, 20)  # a 7×5 grid of 4-pixel patches: odd and unequal sides
CLASSES = 4


def scenes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` dim pictures, each with a bright square in one quadrant (its label), uint8 NHWC."""
    rng = np.random.default_rng(seed)
    h, w = SIZE
    x = rng.uniform(0, 0.3, (n, h, w, 3))
    y = rng.integers(0, CLASSES, n)
    for i, q in enumerate(y):
        oy, ox = (q // 2) * h // 2, (q % 2) * w // 2
        r, c = rng.integers(0, h // 2 - 5), rng.integers(0, w // 2 - 5)
        x[i, oy + r : oy + r + 5, ox + c : ox + c + 5] = rng.uniform(0.7, 1.0, 3)
    return (x * 255).astype(np.uint8), y


def picture_folder(folder: Path, n: int, seed: int) -> Path:
    folder.mkdir(parents=True)
    for i, a in enumerate(scenes(n, seed)[0]):
        Image.fromarray(a).save(folder / f"p{i:03d}.png")
    return folder


def train(model: torch.nn.Module, forward, steps: int = 40, seed: int = 1) -> None:
    """A few Adam steps of ``forward(model, x)`` (logits) on the quadrant pictures: a teacher that has learnt."""
    imgs, labels = scenes(128, seed)
    x = torch.tensor(imgs, dtype=torch.float32).permute(0, 3, 1, 2) / 255
    y = torch.tensor(labels)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(forward(model, x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def lab_teacher(path: Path, seed: int = 0) -> Path:
    """A lab dot model (patch-mean pooling, no prefix) trained a little, as a checkpoint."""
    torch.manual_seed(seed)
    model = ViT(num_classes=CLASSES, img_size=SIZE, patch_size=4, dim=24, depth=2, num_heads=3, attn="dot",
                dropout=0.0, mlp_ratio=2.0)  # fmt: skip
    with torch.no_grad():  # sharp heads whose keys carry their position: where a query looks follows its content
        model.pos_embed.mul_(50.0)
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * 24].mul_(5.0)
    train(model, lambda m, x: m(x))
    with torch.no_grad():  # a confident teacher: its top class is worth agreeing with
        model.head.weight.mul_(4.0)
        model.head.bias.mul_(4.0)
    save_checkpoint(path, model, {"class_names": [f"quadrant {i}" for i in range(CLASSES)]})
    return path


def hf_teacher(folder: Path) -> Path:
    """transformers' ViT (class token) trained a little, written as a folder with a licence in its README."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.ViTConfig(hidden_size=24, num_hidden_layers=2, num_attention_heads=3, image_size=list(SIZE),
                                    patch_size=4, num_labels=CLASSES, intermediate_size=32)  # fmt: skip
    model = transformers.ViTForImageClassification(config)
    train(model, lambda m, x: m((x - 0.5) / 0.5).logits, steps=20)
    model.save_pretrained(folder)
    transformers.ViTImageProcessor(image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    (folder / "README.md").write_text("---\nlicense: apache-2.0\n---\n# a tiny ViT\n")
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("distill")
    return {
        "lab": lab_teacher(root / "dot.safetensors"),
        "hf": hf_teacher(root / "hf_vit"),
        "train": picture_folder(root / "train", 96, 2),
        "held": picture_folder(root / "held", 96, 3),
    }


def distill(made: dict[str, Path], teacher: str, out: Path, *extra: str) -> int:
    return distill_main(["--teacher", str(made[teacher]), "--images", str(made["train"]), "--eval-images",
                         str(made["held"]), "--out", str(out), "--no-progress", *extra])  # fmt: skip


# ------------------------------------------------------------------------------------------- the student


def test_student_attention_matches_a_float64_reference_with_prefix_tokens():
    """A student layer with a class and a distillation token, gates open and probes random, on a 7×5 grid: the
    prefix queries' rows are softmax(q·k/√d) over every token, each patch query's row puts its head's prefix masses
    on the prefix keys and the rest times the oracle's steered field row on the patches; the output is those
    weights on the values through the output projection (biases included)."""
    torch.manual_seed(0)
    grid, p, dim, heads = (7, 5), 2, 12, 3
    attn = SSOGAttention(dim, heads, num_atoms=3, sigma_floor=0.0, cold_init=False, num_prefix=p, qkv_bias=True,
                         proj_bias=True).double()  # fmt: skip
    with torch.no_grad():
        for param in attn.parameters():
            param.copy_(torch.randn_like(param) * 0.5)
    x = torch.randn(2, p + 35, dim, dtype=torch.float64)
    d = dim // heads
    q = (x[:, :p] @ attn.qk.weight[:dim].T + attn.qk.bias[:dim]).view(2, p, heads, d).transpose(1, 2)
    k = (x @ attn.qk.weight[dim:].T + attn.qk.bias[dim:]).view(2, p + 35, heads, d).transpose(1, 2)
    prefix_rows = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1)
    logits = torch.cat([attn.prefix_logits, torch.zeros(heads, 1, dtype=torch.float64)], -1)
    mass = logits.exp() / logits.exp().sum(-1, keepdim=True)
    field = oracle_matrix(attn.field_of(x[:, p:], grid), grid, "factorized", 2)
    patch_rows = torch.cat([mass[None, :, None, :p].expand(2, heads, 35, p), field * mass[None, :, p, None, None]], -1)
    want = torch.cat([prefix_rows, patch_rows], 2)
    got = attn.attention_matrix(x, grid)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, heads, p + 35, dtype=torch.float64))
    v = (x @ attn.v.weight.T + attn.v.bias).view(2, p + 35, heads, d).transpose(1, 2)
    y = (want @ v).transpose(1, 2).reshape(2, p + 35, dim) @ attn.out.weight.T + attn.out.bias
    torch.testing.assert_close(attn(x, grid), y, rtol=1e-10, atol=1e-12)


def test_rows_loss_matches_a_float64_reference_with_prefix_tokens():
    """The row term on a two-layer student with a class token, gates open and probes random, on a 7×5 grid, against
    random teacher patterns: its value and its gradients are those of the mean over layers, heads, patch queries
    and pictures of KL(teacher row ‖ student row), the student's patch rows (renormalised over patch keys) made
    from its steered field by the float64 oracle."""
    torch.manual_seed(0)
    teacher = ViT(num_classes=CLASSES, img_size=SIZE, patch_size=4, dim=12, depth=2, num_heads=3, attn="dot",
                  class_token=True, pool="token")  # fmt: skip
    student = ViT(student_config(teacher.config, 3, ("mu", "sigma", "lambda"), 4.0)).double()
    with torch.no_grad():
        for name, param in student.named_parameters():
            if ".attn." in name:  # atoms of a cell or more: no row underflows the term's clamp at 1e-30
                param.copy_(torch.randn_like(param) * 0.5 + (1.0 if name.endswith("raw_sigma") else 0.0))
    grid, p, b = (7, 5), 1, 2
    patterns = [torch.softmax(torch.randn(b, 3, p + 35, p + 35, dtype=torch.float64) * 3, -1) for _ in range(2)]
    targets = {layer: teacher_rows(pattern, grid, p) for layer, pattern in enumerate(patterns)}
    with attention_inputs(student) as seen:
        student(torch.rand(b, 3, *SIZE, dtype=torch.float64))
    got = rows_loss(student, seen, targets, grid)
    want = []
    for layer, block in enumerate(student.blocks):
        t = patterns[layer][:, :, p:, p:]
        t = t / t.sum(-1, keepdim=True)
        s = oracle_matrix(block.attn.field_of(seen[layer], grid), grid, "factorized", b)
        assert float(s.detach().min()) > 1e-30
        s = s / s.sum(-1, keepdim=True)
        want.append((t * (t.log() - s.log())).sum(-1).mean())
    want = torch.stack(want).mean()
    assert got.dtype == torch.float32 and float(want.detach()) > 0.1
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    chosen = [param for _, param in steering_parameters(student, "all")]
    grads = torch.autograd.grad(got, chosen, retain_graph=True, allow_unused=True)
    wanted = torch.autograd.grad(want.float(), chosen, allow_unused=True)
    assert sum(w is not None and float(w.abs().max()) > 0 for w in wanted) > 20
    for g, w in zip(grads, wanted, strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-12)


def test_row_cross_clamps_rows_below_the_floor_as_the_clamp_does():
    """RowCross against autograd through ``t·log(max(ax @ ay, floor))`` in float64, with some rows' entries below
    the floor (exact zeros and about 1e-35): the same value and the same gradients (none through clamped entries)."""
    torch.manual_seed(1)
    ax = torch.rand(5, 7, 3, dtype=torch.float64)
    ay = torch.rand(5, 3, 4, dtype=torch.float64)
    ax[0, 2] = 0.0  # a row of zeros: s = 0
    ay[1, :, 3] = 1e-35  # s ≈ 1e-35 in that column
    ax, ay = ax.requires_grad_(), ay.requires_grad_()
    t = torch.rand(5, 7, 4, dtype=torch.float64)
    got = RowCross.apply(ax, ay, t)
    want = (t * (ax @ ay).clamp_min(ROW_FLOOR).log()).sum()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    grads = torch.autograd.grad(got * 0.7, (ax, ay))
    for g, w in zip(grads, torch.autograd.grad(want * 0.7, (ax, ay)), strict=True):
        assert bool(torch.isfinite(g).all())
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_step0_field_is_what_fields_reports_and_the_student_reloads_bit_for_bit(made, tmp_path, capsys):
    """The student's fixed field at step 0 is the fields JSON's atoms for the same teacher, pictures and K; the
    rest of its weights are the teacher's; its file reloads bit for bit and opens with info and fields."""
    out = tmp_path / "s.safetensors"
    assert distill(made, "hf", out, "--atoms", "3", "--steps", "2") == 0
    assert fields_main(["--checkpoint", str(made["hf"]), "--images", str(made["train"]), "--atoms", "3", "--json",
                        str(tmp_path / "f.json")]) == 0  # fmt: skip
    heads = json.loads((tmp_path / "f.json").read_text())["heads"]
    state = torch.load(tmp_path / "s.state.pt", weights_only=True)
    student, meta = load_checkpoint(out)
    for h in heads:
        fit = state["fits"][h["layer"]]
        atoms = h["atoms"]
        torch.testing.assert_close(fit["mu"][h["head"]], torch.tensor([[a["mu_y"], a["mu_x"]] for a in atoms],
                                                                        dtype=torch.float64))  # fmt: skip
        torch.testing.assert_close(fit["lam"][h["head"]], torch.tensor([a["weight"] for a in atoms],
                                                                         dtype=torch.float64))  # fmt: skip
    teacher, teacher_meta = load_checkpoint(made["hf"])
    step0 = build_student(teacher, *_fit(teacher, teacher_meta, made), steer=("mu", "sigma", "lambda"))
    for layer, block in enumerate(step0.blocks):
        field = block.attn.fixed_field()
        h = [a for a in heads if a["layer"] == layer]
        mu = torch.tensor([[[a["mu_y"], a["mu_x"]] for a in x["atoms"]] for x in h])
        sigma = torch.tensor([[[a["sigma_y"], a["sigma_x"]] for a in x["atoms"]] for x in h])
        lam = torch.tensor([[a["weight"] for a in x["atoms"]] for x in h])
        torch.testing.assert_close(field.mu, mu, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(field.sigma, sigma, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(field.lam(), lam, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(field.tau, torch.tensor(1.0))
    kept = dict(teacher.state_dict())
    for name, value in step0.state_dict().items():
        if name in kept:
            assert torch.equal(value, kept[name]), name
    assert student.config.sigma_floor == STUDENT_SIGMA_FLOOR and student.config.prefix_dot
    d = meta["distill"]
    assert d["teacher_licence"] == "apache-2.0" and d["pictures"]["first"] == 96 and d["recipe"]["steps"] == 2
    assert meta["step"] == 2 and meta["finished"]
    again = tmp_path / "again.safetensors"
    save_checkpoint(again, student, {k: v for k, v in meta.items() if k != "config"})
    first, second = weights(out), weights(again)
    assert set(second) == {k for k in first if not k.startswith("history.")}
    for name, value in second.items():
        assert torch.equal(first[name], value), name
    capsys.readouterr()
    info_main(["--config", json.dumps(student.config.to_dict())])
    assert "ssog factorized μδ+σδ+λ R3" in capsys.readouterr().out
    assert (
        fields_main(["--checkpoint", str(out), "--images", str(made["held"]), "--json", str(tmp_path / "g.json")]) == 0
    )


def _fit(teacher, meta, made):
    data = pictures_for(teacher, meta, MAX_EVAL_IMAGES, folder=made["train"], up_to=True)
    attention = mean_attention(teacher, data.batches(teacher, 16))
    return attention, fit_layers(attention, 3)


# ------------------------------------------------------------------------------------------- training


@pytest.mark.slow
def test_after_training_agreement_and_share_steered_rise_and_kl_falls_on_held_out_pictures(made, tmp_path):
    """A lab dot teacher whose patch queries all score content (patch-mean pooling, sharp heads): after a short
    distillation the student agrees more with the teacher, its KL falls and its steered heads explain more of the
    teacher's than their fitted fields, on pictures it never trained on; a chart beside the report."""
    out = tmp_path / "s.safetensors"
    assert distill(made, "lab", out, "--steps", "100", "--lr", "1e-2") == 0
    report = json.loads((tmp_path / "s.report.json").read_text())
    a0, a1 = report["step0"], report["final"]  # seen once: agreement 0.48 -> 0.72, KL 0.90 -> 0.58
    assert a1["kl"] < 0.8 * a0["kl"] and a1["agreement"] > a0["agreement"] + 0.1, (a0, a1)
    heads = report["heads"]  # seen once: share_steered − share_fit +0.05 to +0.15 on every head
    assert all(h["share_steered"] > h["share_fit"] + 0.02 for h in heads), heads
    assert all(h["difference"] == pytest.approx(h["share_steered"] - h["share_fit"]) for h in heads)
    assert all(h["steering_reach"] > 0 for h in heads)
    assert report["content_scored"].startswith("nothing") and report["held_out"]["first"] == 96
    assert (tmp_path / "s.report.png").stat().st_size > 0 and (tmp_path / "s.report.svg").stat().st_size > 0


@pytest.mark.slow
def test_step0_student_is_its_fitted_field_on_held_out_pictures(made, tmp_path):
    """At step 0 (cold gates, zero probes) the student's patch rows are its fitted field's: share_steered equals
    share_fit head by head, and no atom has moved."""
    out = tmp_path / "s.safetensors"
    assert distill(made, "lab", out, "--steps", "1", "--lr", "1e-12", "--gate-lr-mult", "1") == 0
    for h in json.loads((tmp_path / "s.report.json").read_text())["heads"]:
        assert h["share_steered"] == pytest.approx(h["share_fit"], abs=1e-6)
        assert h["steering_reach"] < 1e-6


@pytest.mark.slow
def test_gates_stay_at_most_max_gate_so_content_moves_atoms_at_most_max_gate_times_max_offset(made, tmp_path):
    """At a gate rate that lets gates grow past the bound (the control, --max-gate 1e9), the bounded run keeps every
    gate scale at the bound or below, some at it, and no head's steering reach beyond max_gate × max_offset."""
    fast = ("--steps", "30", "--lr", "1e-2", "--gate-lr-mult", "1000", "--max-offset", "4")
    free, bounded = tmp_path / "free.safetensors", tmp_path / "bounded.safetensors"
    assert distill(made, "lab", free, *fast, "--max-gate", "1e9") == 0
    assert distill(made, "lab", bounded, *fast, "--max-gate", "0.5") == 0

    def gates(path: Path) -> torch.Tensor:
        model, _ = load_checkpoint(path)
        return torch.cat([s.flatten() for blk in model.blocks for s in blk.attn.gate_scales().values()]).detach()

    assert gates(free).max() > 0.6  # the control: unbounded, they grow past the bound
    g = gates(bounded)
    assert g.max() <= 0.5 + 1e-6 and g.max() >= 0.5 - 1e-4, g
    reach = [h["steering_reach"] for h in json.loads((tmp_path / "bounded.report.json").read_text())["heads"]]
    assert max(reach) <= 0.5 * 4 + 1e-4 and max(reach) > 0, reach


@pytest.mark.slow
def test_resume_continues_bit_for_bit(made, tmp_path):
    """Stopped after 2 steps and resumed, the student ends where the uninterrupted run does, weight for weight; a
    resumed run that changes its recipe is refused."""
    straight, stopped = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    assert distill(made, "lab", straight, "--steps", "4", "--rows-weight", "0.5") == 0
    assert distill(made, "lab", stopped, "--steps", "4", "--rows-weight", "0.5", "--stop-after", "2") == 0
    assert load_checkpoint(stopped)[1]["step"] == 2 and not (tmp_path / "b.report.json").exists()
    assert distill_main(["--out", str(stopped), "--resume", "--steps", "5"]) == 2
    assert distill_main(["--out", str(stopped), "--resume", "--no-progress"]) == 0
    a, b = weights(straight), weights(stopped)
    assert [k for k in a if not k.startswith("history.")] == [k for k in b if not k.startswith("history.")]
    for name in a:
        if not name.startswith("history."):
            assert torch.equal(a[name], b[name]), name
    assert json.loads((tmp_path / "b.report.json").read_text())["step"] == 4


# ------------------------------------------------------------------------------------------- refusals


@pytest.mark.slow
def test_bad_teachers_and_pictures_are_refused_in_words(made, tmp_path, capsys):
    ssog = tmp_path / "ssog.safetensors"
    save_checkpoint(ssog, ViT(num_classes=3, img_size=SIZE, patch_size=4, dim=8, depth=1, num_heads=2))
    rbf = tmp_path / "rbf.safetensors"
    save_checkpoint(rbf, ViT(num_classes=3, img_size=SIZE, patch_size=4, dim=8, depth=1, num_heads=2, attn="rbf"))
    out = str(tmp_path / "s.safetensors")
    cases = [
        (["--teacher", str(ssog), "--images", str(made["train"]), "--eval-images", str(made["held"])],
         "has ssog attention"),
        (["--teacher", str(rbf), "--images", str(made["train"]), "--eval-images", str(made["held"])],
         "has rbf attention"),
        (["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["train"])],
         "held-out pictures must differ"),
        (["--teacher", str(made["lab"]), "--images", "16", "--eval-images", str(made["held"])],
         "the teacher records no data: give a folder of pictures"),
        (["--teacher", str(made["lab"]), "--images", str(tmp_path / "nowhere"), "--eval-images", str(made["held"])],
         "takes a number of validation images (at least 1) or a folder"),
        (["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["held"]),
          "--steer", "mu,nu"], "--steer takes distinct taps"),
        (["--teacher", str(made["lab"]), "--images", str(made["train"]), "--eval-images", str(made["held"]),
          "--steps", "0"], "--steps must be a whole number of at least 1"),
        (["--teacher", str(tmp_path / "none.safetensors"), "--images", str(made["train"]), "--eval-images",
          str(made["held"])], "none.safetensors"),
        (["--images", str(made["train"])], "a new distillation needs --teacher, --eval-images"),
    ]  # fmt: skip
    for args, words in cases:
        assert distill_main([*args, "--out", out, "--no-progress"]) == 2, words
        assert words in capsys.readouterr().err, words
    assert distill_main(["--out", str(tmp_path / "never.safetensors"), "--resume"]) == 2
    assert "nothing to resume" in capsys.readouterr().err

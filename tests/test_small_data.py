"""The small-data study (``experiments/small_data.py``): the digits trees it trains on (the present configuration's, the
size sweep's 16×16 tree and its stratified subsets), the report it reads off finished runs (accuracies, paired
gaps, clean train accuracy, the gaps at matched steps and CPU time, the verdicts, the plot, the section in
RESULTS.md), and its runner's resume/skip logic on a one-epoch run. The report tests use fake finished runs whose
files have the formats ``train`` and ``evaluate --json`` write, with numbers chosen so every expected value below can
be worked out by hand."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from ssog_core.checkpoint.format import read_checkpoint
from ssog_core.train.accuracy import transfer_curve

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = {"train": 1438, "val": 359, "size": 12}
# sha256 of the sorted val indices (into load_digits()) of the published runs' tree: a changed split would make
# new runs incomparable with the numbers in docs/SMALL_DATA.md.
VAL_SPLIT_SHA256 = "c1bdfa56e8f8d393505d7d3acb814fe2e9f1a4d0f977044396c50f178f037d96"
SIZES = [
    (6, 9),
    (8, 16),
    (12, 36),
    (18, 81),
    (24, 144),
]  # the standard transfer sizes at 12×12, patch 2: (side, tokens)


@pytest.fixture(scope="module")
def sd() -> ModuleType:
    spec = importlib.util.spec_from_file_location("small_data", ROOT / "experiments" / "small_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------------ the data set


@pytest.fixture(scope="module")
def digits_tree(sd, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("data") / "digits"
    assert sd.build_digits(folder) == MANIFEST
    return folder


def _indices(folder: Path, split: str) -> dict[int, list[int]]:
    """Digit -> the load_digits() indices its files in ``split`` hold (files are named by index)."""
    return {int(d.name): sorted(int(p.stem) for p in d.glob("*.png")) for d in (folder / split).iterdir()}


def test_digits_tree_is_a_stratified_split_of_every_image(digits_tree):
    from sklearn.datasets import load_digits

    digits = load_digits()
    assert json.loads((digits_tree / "manifest.json").read_text()) == MANIFEST
    train, val = _indices(digits_tree, "train"), _indices(digits_tree, "val")
    assert sorted(train) == sorted(val) == list(range(10))
    every = [i for split in (train, val) for idx in split.values() for i in idx]
    assert sorted(every) == list(range(len(digits.target)))  # each image once, in one split only
    for label in range(10):
        assert all(digits.target[i] == label for i in train[label] + val[label])
        in_class = int((digits.target == label).sum())
        assert abs(len(val[label]) - 0.2 * in_class) <= 0.5  # 20% of each class, rounded
    assert sum(map(len, train.values())) == MANIFEST["train"] and sum(map(len, val.values())) == MANIFEST["val"]
    val_indices = sorted(i for idx in val.values() for i in idx)
    assert hashlib.sha256(json.dumps(val_indices).encode()).hexdigest() == VAL_SPLIT_SHA256


def test_digits_pngs_are_the_8x8_images_upsampled_to_full_range(digits_tree):
    from sklearn.datasets import load_digits

    digits = load_digits()
    brightest = 0
    for path in digits_tree.rglob("*.png"):
        with Image.open(path) as im:
            assert (im.mode, im.size) == ("L", (12, 12))
            pixels = np.asarray(im)
        source = digits.images[int(path.stem)] * (255 / 16)
        back = np.asarray(Image.fromarray(pixels).resize((8, 8), Image.Resampling.BILINEAR), dtype=float)
        assert np.corrcoef(back.ravel(), source.ravel())[0, 1] > 0.85, path  # the same digit, the right way up
        assert abs(pixels.mean() - source.mean()) < 10, path  # 0..16 scaled to 0..255, not left at 0..16
        brightest = max(brightest, int(pixels.max()))
    assert brightest == 255


def test_build_digits_twice_rewrites_nothing(sd, digits_tree):
    before = {p: p.stat().st_mtime_ns for p in digits_tree.rglob("*")}
    assert sd.build_digits(digits_tree) == MANIFEST
    assert {p: p.stat().st_mtime_ns for p in digits_tree.rglob("*")} == before


@pytest.mark.parametrize("manifest", [{"train": 1, "val": 1, "size": 8}, None], ids=["other-size", "no-manifest"])
def test_build_digits_refuses_a_folder_holding_another_version(sd, tmp_path, manifest):
    folder = tmp_path / "digits"
    (folder / "train" / "0").mkdir(parents=True)
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SystemExit, match="another version"):
        sd.build_digits(folder)
    assert sorted(p.name for p in folder.rglob("*")) == sorted(["train", "0"] + (["manifest.json"] if manifest else []))


@pytest.fixture(scope="module")
def sweep_tree(sd, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("sweep") / "digits16"
    assert sd.build_digits(folder, 16, "nearest") == {**MANIFEST, "size": 16, "resample": "nearest"}
    return folder


def test_sweep_tree_is_the_same_split_nearest_upsampled(sd, sweep_tree, digits_tree):
    from sklearn.datasets import load_digits

    digits = load_digits()
    assert _indices(sweep_tree, "train") == _indices(digits_tree, "train")
    assert _indices(sweep_tree, "val") == _indices(digits_tree, "val")
    val_indices = sorted(i for idx in _indices(sweep_tree, "val").values() for i in idx)
    assert hashlib.sha256(json.dumps(val_indices).encode()).hexdigest() == VAL_SPLIT_SHA256
    for path in sweep_tree.rglob("*.png"):
        with Image.open(path) as im:
            assert (im.mode, im.size) == ("L", (16, 16))
            pixels = np.asarray(im)
        source = np.round(digits.images[int(path.stem)] * (255 / 16)).astype(np.uint8)
        np.testing.assert_array_equal(pixels, np.kron(source, np.ones((2, 2), np.uint8)), err_msg=str(path))


def test_a_tree_of_another_resampling_is_refused(sd, sweep_tree, tmp_path):
    shutil.copytree(sweep_tree, tmp_path / "d")
    with pytest.raises(SystemExit, match="another version"):
        sd.build_digits(tmp_path / "d", 16, "bilinear")


@pytest.mark.parametrize(
    ("per_class", "n", "want"),
    [
        ({0: 5, 1: 3, 2: 2}, 5, {0: 3, 1: 1, 2: 1}),  # 2.5, 1.5, 1.0: one image left over, the tie to digit 0
        ({0: 5, 1: 3, 2: 2}, 10, {0: 5, 1: 3, 2: 2}),
        ({0: 4, 1: 4, 2: 4}, 2, {0: 1, 1: 1, 2: 0}),
        ({0: 1, 1: 9}, 5, {0: 1, 1: 4}),  # 0.5 and 4.5: equal remainders, the leftover image to digit 0
    ],
)
def test_stratified_counts(sd, per_class, n, want):
    assert sd.stratified_counts(per_class, n) == want


@pytest.mark.parametrize("n", [0, 11])
def test_stratified_counts_refuses_an_impossible_size(sd, n):
    with pytest.raises(ValueError, match="subset"):
        sd.stratified_counts({0: 5, 1: 5}, n)


def test_subsets_are_stratified_nested_copies_and_share_the_val_split(sd, sweep_tree, tmp_path):
    full_train = _indices(sweep_tree, "train")
    subsets = {}
    for n in (250, 500, 1438):
        folder = tmp_path / f"n{n}"
        assert sd.build_subset(sweep_tree, folder, n) == {
            "train": n, "val": 359, "size": 16, "resample": "nearest", "subset_of": "digits16"
        }  # fmt: skip
        subsets[n] = _indices(folder, "train")
        counts = {c: len(idx) for c, idx in subsets[n].items()}
        assert counts == sd.stratified_counts({c: len(idx) for c, idx in full_train.items()}, n)
        assert all(abs(counts[c] - n * len(full_train[c]) / 1438) < 1 for c in counts)
        assert _indices(folder, "val") == _indices(sweep_tree, "val")
        for path in folder.rglob("*.png"):
            assert path.read_bytes() == (sweep_tree / path.relative_to(folder)).read_bytes()
    assert subsets[1438] == full_train
    for small, large in ((250, 500), (500, 1438)):
        assert all(set(subsets[small][c]) <= set(subsets[large][c]) for c in range(10)), (small, large)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "n250").rglob("*")}
    assert sd.build_subset(sweep_tree, tmp_path / "n250", 250)["train"] == 250
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "n250").rglob("*")} == before
    with pytest.raises(SystemExit, match="another version"):
        sd.build_subset(sweep_tree, tmp_path / "n250", 500)


def test_train_view_scores_a_subset_on_its_own_training_images(sd, sweep_tree, tmp_path):
    folder = tmp_path / "digits16-n250"
    sd.build_subset(sweep_tree, folder, 250)
    view = sd.train_view(folder)
    assert view == tmp_path / "digits16-n250-train-view" and sd.train_view(folder) == view  # idempotent
    assert _indices(view, "val") == _indices(view, "train") == _indices(folder, "train")
    assert (view / "val").resolve() == (folder / "train").resolve() and not Path.readlink(view / "val").is_absolute()


# ------------------------------------------------------------------------------------------------ fake runs


def write_run(
    out: Path,
    val_acc: list[float],
    epoch_cpu_s: list[float],
    accuracy: float | None,
    transfer: list[float] | None = None,
    epoch_time_s: float = 3.0,
    steps_per_epoch: int = 11,
    train_accuracy: float | None = None,
    size: int = 12,
) -> None:
    """The files a run leaves: ``metrics.jsonl`` as ``train`` logs it, ``cpu_s.json`` from the runner, the final
    model's ``model.transfer.json`` (``transfer``: accuracy at each of SIZES) and ``eval.json`` as
    ``evaluate --json`` writes it at the training size (``accuracy`` None: an unfinished run, no eval.json), and
    for the sweep ``train_eval.json``, the same on the run's own training images (``train_accuracy``)."""
    out.mkdir(parents=True)
    rows = [
        {"epoch": e + 1, "step": steps_per_epoch * (e + 1), "lr": 1e-3, "train_loss": 1.0, "train_acc": 0.5,
         "val_loss": 1.0, "val_acc": acc, "epoch_time_s": epoch_time_s, "epoch_cpu_s": cpu, "img_per_s": 800.0}
        for e, (acc, cpu) in enumerate(zip(val_acc, epoch_cpu_s, strict=True))
    ]  # fmt: skip
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "cpu_s.json").write_text(json.dumps({"train": sum(epoch_cpu_s) + 7.0}))
    (out / "train_state.pt").write_bytes(b"")  # never read by the report
    if transfer is not None:
        curve = [
            {"size": (s, s), "grid": (s // 2, s // 2), "accuracy": a} for (s, _), a in zip(SIZES, transfer, strict=True)
        ]
        (out / "model.transfer.json").write_text(json.dumps(transfer_curve(curve), indent=1))
    if accuracy is not None:
        (out / "model.safetensors").write_bytes(b"")
        for name, acc in (("eval.json", accuracy), ("train_eval.json", train_accuracy)):
            if acc is not None:
                at_training_size = [{"size": (size, size), "grid": (size // 2, size // 2), "accuracy": acc}]
                (out / name).write_text(json.dumps(transfer_curve(at_training_size), indent=1))


# (crop, model, seed): val_acc per epoch, epoch_cpu_s per epoch, final accuracy (eval.json), transfer curve.
# The final accuracies differ from the last val_acc on purpose: the table must take evaluate's number.
# Matched CPU time, worked out by hand (cumulative CPU s; the pair is compared when the cheaper one finished):
#   pad-crop s0: ssog 20,40,60,80  dot 15,30,45,60       -> 60:  ssog 0.80 (epoch 3), dot 0.84 (epoch 4)
#   pad-crop s1: ssog 10,20,30,40  dot 12.5,25,37.5,50   -> 40:  ssog 0.91 (epoch 4), dot 0.75 (epoch 3)
#   pad-crop s2: ssog 10.1,30.3,60.6,100 (float sums just off 100)  dot 25..100 -> 100: both at epoch 4
#   resized s0:  ssog 5,10,15,20   dot 4,8,12,16         -> 16:  ssog 0.70 (epoch 3), dot 0.81 (epoch 4)
#   resized s1:  ssog 5,10,15,20   dot 6,12,18,24        -> 20:  ssog 0.83 (epoch 4), dot 0.70 (epoch 3)
#   resized s2:  the dot run is unfinished (no eval.json), so seed 2 is not paired there.
FAKE_RUNS = {
    ("pad-crop", "ssog", 0): ([0.3, 0.6, 0.8, 0.88], [20.0] * 4, 0.90, [0.3, 0.6, 0.9, 0.5, 0.4]),
    ("pad-crop", "dot", 0): ([0.4, 0.6, 0.7, 0.84], [15.0] * 4, 0.85, [0.2, 0.5, 0.85, 0.3, 0.2]),
    ("pad-crop", "ssog", 1): ([0.5, 0.7, 0.85, 0.91], [10.0] * 4, 0.92, [0.4, 0.7, 0.92, 0.6, 0.5]),
    ("pad-crop", "dot", 1): ([0.4, 0.65, 0.75, 0.86], [12.5] * 4, 0.86, [0.4, 0.7, 0.86, 0.5, 0.3]),
    ("pad-crop", "ssog", 2): ([0.5, 0.7, 0.9, 0.93], [10.1, 20.2, 30.3, 39.4], 0.94, [0.5, 0.8, 0.94, 0.7, 0.6]),
    ("pad-crop", "dot", 2): ([0.5, 0.8, 0.85, 0.89], [25.0] * 4, 0.90, None),
    ("resized-crop", "ssog", 0): ([0.2, 0.5, 0.7, 0.79], [5.0] * 4, 0.80, None),
    ("resized-crop", "dot", 0): ([0.3, 0.6, 0.75, 0.81], [4.0] * 4, 0.83, None),
    ("resized-crop", "ssog", 1): ([0.3, 0.6, 0.8, 0.83], [5.0] * 4, 0.84, None),
    ("resized-crop", "dot", 1): ([0.2, 0.5, 0.7, 0.8], [6.0] * 4, 0.82, None),
    ("resized-crop", "ssog", 2): ([0.9, 0.95, 0.97, 0.99], [5.0] * 4, 0.99, None),
    ("resized-crop", "dot", 2): ([0.3, 0.5], [4.0] * 2, None, None),
}
SEEDS = [0, 1, 2]
# seed: (ssog, dot, gap, matched CPU s, ssog then, dot then, gap then, ssog CPU s, dot CPU s)
EXPECTED = {
    "pad-crop": {
        0: (0.90, 0.85, 0.05, 60.0, 0.80, 0.84, -0.04, 80.0, 60.0),
        1: (0.92, 0.86, 0.06, 40.0, 0.91, 0.75, 0.16, 40.0, 50.0),
        2: (0.94, 0.90, 0.04, 100.0, 0.93, 0.89, 0.04, 100.0, 100.0),
    },
    "resized-crop": {
        0: (0.80, 0.83, -0.03, 16.0, 0.70, 0.81, -0.11, 20.0, 16.0),
        1: (0.84, 0.82, 0.02, 20.0, 0.83, 0.70, 0.13, 20.0, 24.0),
    },
}
KEYS = ("ssog", "dot", "gap", "matched_cpu_s", "ssog_at_matched", "dot_at_matched", "gap_at_matched")


def write_fake_runs(sd: ModuleType, root: Path, runs: dict = FAKE_RUNS) -> Path:
    for (crop, model, seed), (val_acc, cpu, accuracy, transfer) in runs.items():
        write_run(sd.run_dir(root, crop, model, seed), val_acc, cpu, accuracy, transfer)
    return root


@pytest.fixture
def fake_root(sd, tmp_path) -> Path:
    return write_fake_runs(sd, tmp_path / "small_data")


# ------------------------------------------------------------------------------------------------ the report


def test_summarise_pairs_finished_runs_and_matches_cpu_time(sd, fake_root):
    table = sd.summarise(fake_root, SEEDS)
    assert list(table) == list(sd.CROPS)
    for crop, expected in EXPECTED.items():
        assert [r["seed"] for r in table[crop]] == list(expected)
        for row in table[crop]:
            want = expected[row["seed"]]
            assert [row[k] for k in KEYS] == pytest.approx(list(want[: len(KEYS)]), abs=1e-9), (crop, row["seed"])
            assert (row["ssog_cpu_s"], row["dot_cpu_s"]) == pytest.approx(want[len(KEYS) :])
            assert row["ssog_wall_s"] == row["dot_wall_s"] == pytest.approx(3.0 * 4)
            model_runs = {m: FAKE_RUNS[(crop, m, row["seed"])] for m in sd.MODELS}
            assert row["ssog_val_acc"] == model_runs["ssog"][0] and row["dot_val_acc"] == model_runs["dot"][0]
    first = table["pad-crop"][0]["ssog_transfer"]
    assert [(p["img_size"], p["tokens"], p["accuracy"]) for p in first] == [
        ([s, s], t, a) for (s, t), a in zip(SIZES, FAKE_RUNS[("pad-crop", "ssog", 0)][3], strict=True)
    ]
    assert table["pad-crop"][2]["dot_transfer"] is None and table["resized-crop"][0]["ssog_transfer"] is None


def test_accuracy_at_a_cpu_budget(sd):
    run = {"val_acc": [0.2, 0.5, 0.7], "cpu_s": [10.0, 20.0, 30.0]}
    assert [sd._acc_at(run, t) for t in (9.99, 10.0, 29.0, 30.0, 99.0)] == [0.0, 0.2, 0.5, 0.7, 0.7]


def test_mean_and_sample_std_in_points(sd):
    assert sd._ms([0.80, 0.90, 0.85]) == "85.0 ± 5.0"
    assert sd._ms([-0.01, -0.03]) == "-2.0 ± 1.4"  # the sign stays on a negative mean
    assert sd._ms([0.873]) == "87.3" and sd._ms([]) == "–"


def test_markdown_tables(sd, fake_root):
    counts = {"train": 1438, "val": 359, "size": 12}
    text = sd.markdown(sd.summarise(fake_root, SEEDS), counts, 4, SEEDS)
    lines = text.splitlines()
    assert "1438 train / 359 val images" in text and ", 4 epochs," in text
    assert "**Unfinished:** `resized-crop` seed 2 (" in text and "planned pairs finished" not in text
    # mean ± sample std over seeds: pad-crop SSOG 90, 92, 94; dot 85, 86, 90; gaps 5, 6, 4; gaps then -4, 16, 4;
    # CPU s 80, 40, 100 and 60, 50, 100.  resized-crop: 80, 84; 83, 82; gaps -3, 2; then -11, 13; 20, 20 and 16, 24.
    assert "| `pad-crop` | 3 | 92.0 ± 2.0 | 87.0 ± 2.6 | 5.0 ± 1.0 | 5.3 ± 10.1 | 73, 70 |" in lines
    assert "| `resized-crop` | 2 | 82.0 ± 2.8 | 82.5 ± 0.7 | -0.5 ± 3.5 | 1.0 ± 17.0 | 20, 20 |" in lines
    per_seed = [line for line in lines if line.startswith("| `") and line.count("|") == 10]
    assert per_seed == [
        "| `pad-crop` | 0 | 90.0 | 85.0 | +5.0 | 60 | 80.0 | 84.0 | -4.0 |",
        "| `pad-crop` | 1 | 92.0 | 86.0 | +6.0 | 40 | 91.0 | 75.0 | +16.0 |",
        "| `pad-crop` | 2 | 94.0 | 90.0 | +4.0 | 100 | 93.0 | 89.0 | +4.0 |",
        "| `resized-crop` | 0 | 80.0 | 83.0 | -3.0 | 16 | 70.0 | 81.0 | -11.0 |",
        "| `resized-crop` | 1 | 84.0 | 82.0 | +2.0 | 20 | 83.0 | 70.0 | +13.0 |",
    ]
    # transfer: the mean over the runs that have a curve (pad-crop dot: seeds 0 and 1 only); none for resized-crop
    header = "| crop | model | 6² (9 tokens) | 8² (16 tokens) | 12² (36 tokens) | 18² (81 tokens) | 24² (144 tokens) |"
    transfer_rows = [line for line in lines[lines.index(header) :] if line.startswith("| `")]
    assert transfer_rows == [
        "| `pad-crop` | ssog | 40.0 | 70.0 | 92.0 | 60.0 | 50.0 |",
        "| `pad-crop` | dot | 30.0 | 60.0 | 85.5 | 40.0 | 25.0 |",
    ]


def test_markdown_and_section_with_one_seed_and_an_empty_crop(sd, tmp_path):
    runs = {k: v for k, v in FAKE_RUNS.items() if k[0] == "pad-crop" and k[2] == 0}
    table = sd.summarise(write_fake_runs(sd, tmp_path, runs), [0])
    text = sd.markdown(table, MANIFEST, 4, [0])
    assert table["resized-crop"] == []
    assert "| `pad-crop` | 1 | 90.0 | 85.0 | 5.0 | -4.0 | 80, 60 |" in text.splitlines()  # one seed: no ± std
    assert "| `resized-crop` | 0 | – | – | – | – | – |" in text.splitlines()
    assert "**Unfinished:** `resized-crop` seed 0 (" in text
    section = sd.results_section([], table, [0])
    assert "`pad-crop`: SSOG 90.0%, dot 85.0%, paired gap 5.0 points (1 seed)." in section
    assert "`resized-crop`" not in section and "Too few finished seeds for a verdict." in section


def test_results_section_and_verdict(sd, fake_root):
    section = sd.results_section([], sd.summarise(fake_root, SEEDS), SEEDS)
    assert section.startswith(sd.MARK_BEGIN + "\n") and section.endswith("\n" + sd.MARK_END)
    assert "`pad-crop`: SSOG 92.0 ± 2.0%, dot 87.0 ± 2.6%, paired gap 5.0 ± 1.0 points (3 seeds)." in section
    assert "`resized-crop`: SSOG 82.0 ± 2.8%, dot 82.5 ± 0.7%, paired gap -0.5 ± 3.5 points (2 seeds)." in section
    assert "`pad-crop`: SSOG ahead by 5.0 points, beyond one std (1.0)" in section
    assert "`resized-crop`: the dot twin ahead by 0.5 points, within one std (3.5)" in section
    assert section.count(sd.MARK_BEGIN) == section.count(sd.MARK_END) == 1
    assert "In this configuration (d32, 2 layers, 36 tokens, 1,438 images, batch 128) it appears under `pad-crop`." in (
        section
    )


def _gaps(**crops: list[float]) -> dict[str, list[dict[str, float]]]:
    """A table holding only the paired gaps, all the verdict reads (``pad_crop=`` names the crop ``pad-crop``)."""
    return {crop.replace("_", "-"): [{"gap": g} for g in gaps] for crop, gaps in crops.items()}


@pytest.mark.parametrize(
    ("table", "reads", "found"),
    [
        (_gaps(pad_crop=[0.02, -0.01, 0.05]), "SSOG ahead by 2.0 points, within one std (3.0)", "does not appear"),
        (_gaps(pad_crop=[-0.05, -0.06, -0.04]), "the dot twin ahead by 5.0 points, beyond one std (1.0)",
         "does not appear"),
        (_gaps(pad_crop=[0.05, 0.06, 0.04], resized_crop=[0.10, 0.12]), "`resized-crop`: SSOG ahead by 11.0 points",
         "it appears under `pad-crop` and `resized-crop`."),
        (_gaps(pad_crop=[0.05], resized_crop=[]), "Too few finished seeds for a verdict.", "Too few"),
    ],
    ids=["ssog-within-std", "dot-clearly-ahead", "ssog-clear-under-both", "one-seed"],
)  # fmt: skip
def test_verdict_counts_only_a_clear_ssog_lead(sd, table, reads, found):
    verdict = sd._verdict(table)
    assert reads in verdict and found in verdict
    assert ("it appears under" in verdict) == (found.startswith("it appears"))


# ------------------------------------------------------------------------------------------------ the size sweep


# (arch, n, model, seed): val_acc per epoch, epoch_cpu_s per epoch, final val accuracy, clean train accuracy.
# 4 epochs; 500 images make 7 steps an epoch (batch 64, drop_last), 250 make 3. Worked out by hand:
#   n500 s0: gap 80-70 = +10; matched CPU 20 s (dot: 5,10,15,20): ssog 0.5 (epoch 2), dot 0.7 -> -20;
#            at 25% (epoch 1, step 7) 20-10 = +10, at 50% (epoch 2, step 14) +10, at 100% (step 28) +10
#   n500 s1: gap +6; matched 40 s -> 85-80 = +5; at the shares 0, +10, +5
#   n500 s2: gap +8; matched 40 s -> 90-80 = +10; at the shares +20, +30, +10
#   n250 s0: gap -5 (the only pair: s1's dot run is unfinished, s2's SSOG run has no clean train evaluation)
#   n1438: no runs.
SWEEP_RUNS = {
    ("d64-L4", 500, "ssog", 0): ([0.2, 0.5, 0.7, 0.8], [10.0] * 4, 0.80, 0.95),
    ("d64-L4", 500, "dot", 0): ([0.1, 0.4, 0.6, 0.7], [5.0] * 4, 0.70, 1.00),
    ("d64-L4", 500, "ssog", 1): ([0.3, 0.6, 0.8, 0.85], [10.0] * 4, 0.86, 0.97),
    ("d64-L4", 500, "dot", 1): ([0.3, 0.5, 0.7, 0.8], [10.0] * 4, 0.80, 0.99),
    ("d64-L4", 500, "ssog", 2): ([0.4, 0.6, 0.8, 0.9], [10.0] * 4, 0.90, 0.98),
    ("d64-L4", 500, "dot", 2): ([0.2, 0.3, 0.6, 0.8], [10.0] * 4, 0.82, 1.00),
    ("d64-L4", 250, "ssog", 0): ([0.2, 0.3, 0.4, 0.5], [5.0] * 4, 0.50, 0.90),
    ("d64-L4", 250, "dot", 0): ([0.2, 0.3, 0.4, 0.55], [5.0] * 4, 0.55, 1.00),
    ("d64-L4", 250, "ssog", 1): ([0.2, 0.3, 0.4, 0.6], [5.0] * 4, 0.60, 0.92),
    ("d64-L4", 250, "dot", 1): ([0.2, 0.3], [5.0] * 2, None, None),
    ("d64-L4", 250, "ssog", 2): ([0.2, 0.3, 0.4, 0.6], [5.0] * 4, 0.60, None),
    ("d64-L4", 250, "dot", 2): ([0.2, 0.3, 0.4, 0.6], [5.0] * 4, 0.60, 0.95),
}


def write_sweep_runs(sd: ModuleType, root: Path, runs: dict = SWEEP_RUNS) -> Path:
    for (arch, n, model, seed), (val_acc, cpu, accuracy, train_accuracy) in runs.items():
        out = sd.sweep_dir(root, arch, n, model, seed)
        write_run(out, val_acc, cpu, accuracy, steps_per_epoch=7 if n == 500 else 3, train_accuracy=train_accuracy,
                  size=16)  # fmt: skip
    return root


@pytest.fixture
def sweep_root(sd, tmp_path) -> Path:
    return write_sweep_runs(sd, tmp_path / "small_data")


def test_summarise_sizes_pairs_runs_with_both_evaluations(sd, sweep_root):
    cells = sd.summarise_sizes(sweep_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    assert [(c["arch"], c["n"], [r["seed"] for r in c["rows"]]) for c in cells] == [
        ("d64-L4", 250, [0]),
        ("d64-L4", 500, [0, 1, 2]),
        ("d64-L4", 1438, []),
    ]
    rows = cells[1]["rows"]
    assert [(r["ssog"], r["dot"], r["ssog_train"], r["dot_train"]) for r in rows] == [
        (0.80, 0.70, 0.95, 1.00),
        (0.86, 0.80, 0.97, 0.99),
        (0.90, 0.82, 0.98, 1.00),
    ]
    assert [r["gap"] for r in rows] == pytest.approx([0.10, 0.06, 0.08])
    assert [r["matched_cpu_s"] for r in rows] == pytest.approx([20.0, 40.0, 40.0])
    assert [r["gap_at_matched"] for r in rows] == pytest.approx([-0.20, 0.05, 0.10])
    assert [r["steps"] for r in rows] == [28, 28, 28]
    assert [[p["step"] for p in r["at_steps"]] for r in rows] == [[7, 14, 28]] * 3
    assert [[p["gap"] for p in r["at_steps"]] for r in rows] == [
        pytest.approx(g) for g in ([0.10, 0.10, 0.10], [0.0, 0.10, 0.05], [0.20, 0.30, 0.10])
    ]
    assert cells[0]["rows"][0]["gap"] == pytest.approx(-0.05) and cells[0]["rows"][0]["steps"] == 12
    assert [c["epochs"] for c in cells] == [None] * 3  # no step-matched run


def test_the_step_matched_run_is_a_cell_of_its_own(sd, sweep_root):
    for model, acc in (("ssog", 0.9), ("dot", 0.85)):
        out = sd.sweep_dir(sweep_root, "d64-L4", 1438, model, 0, 32)
        assert out.parent.name == "n1438-e32"
        write_run(out, [0.5, acc], [1.0, 1.0], acc, steps_per_epoch=22, train_accuracy=0.95, size=16)
    cells = sd.summarise_sizes(sweep_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    assert [(c["n"], c["epochs"], len(c["rows"])) for c in cells] == [(250, None, 1), (500, None, 3), (1438, None, 0),
                                                                      (1438, 32, 1)]  # fmt: skip
    assert cells[3]["rows"][0]["gap"] == pytest.approx(0.05)
    lines = sd.sizes_markdown(cells, 4, SEEDS).splitlines()
    assert "| d64, 4 layers | 1,438 × 32 epochs | 1 | 90.0 | 85.0 | 5.0 | 95.0 | 95.0 | 5.0 | 2, 2 |" in lines
    (text,) = sd._data_or_steps(cells)
    assert text.startswith(
        "**Data or steps?** With a fixed 100 epochs fewer images also means fewer steps (250: 12, 500: 28)."
    )
    assert "At 500 images the final gap (28 steps) is 8.0 ± 2.0." in text
    end = "The step-matched run, all 1,438 images for 32 epochs (44 steps, a full schedule): 5.0 (1 seed)."
    assert text.endswith(end)
    assert sd._data_or_steps([c for c in cells if c["epochs"] is None]) == []  # no such run, no 1,438 run that long


def test_summarise_sizes_refuses_a_pair_that_made_different_steps(sd, tmp_path):
    for model, per_epoch in (("ssog", 7), ("dot", 6)):
        out = sd.sweep_dir(tmp_path, "d64-L4", 500, model, 0)
        write_run(out, [0.5, 0.6], [1.0, 1.0], 0.6, steps_per_epoch=per_epoch, train_accuracy=0.9, size=16)
    with pytest.raises(ValueError, match="different steps"):
        sd.summarise_sizes(tmp_path, ["d64-L4"], [500], [0])


def test_sizes_markdown_tables(sd, sweep_root):
    cells = sd.summarise_sizes(sweep_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    lines = sd.sizes_markdown(cells, 4, SEEDS).splitlines()
    # n500: SSOG 80, 86, 90; dot 70, 80, 82; gaps 10, 6, 8; clean train 95, 97, 98 and 100, 99, 100;
    # gaps at matched CPU -20, 5, 10; CPU s 40, 40, 40 and 20, 40, 40
    want = "| d64, 4 layers | 500 | 3 | 85.3 ± 5.0 | 77.3 ± 6.4 | 8.0 ± 2.0 | 96.7 ± 1.5 | 99.7 ± 0.6 | -1.7 ± 16.1 |"
    assert f"{want} 40, 33 |" in lines
    assert "| d64, 4 layers | 250 | 1 | 50.0 | 55.0 | -5.0 | 90.0 | 100.0 | -5.0 | 20, 20 |" in lines
    assert "| d64, 4 layers | 1,438 | 0 | – | – | – | – | – | – | – |" in lines
    # at matched steps: 25% gaps 10, 0, 20; 50% 10, 10, 30; 100% 10, 5, 10
    assert "| d64, 4 layers | 500 | 7 / 14 / 28 | 10.0 ± 10.0 | 16.7 ± 11.5 | 8.3 ± 2.9 | – |" in lines
    assert "| d64, 4 layers | 250 | 3 / 6 / 12 | 0.0 | 0.0 | -5.0 | – |" in lines
    assert "| d64, 4 layers | 500 | 1 | 86.0 | 80.0 | +6.0 | 97.0 | 99.0 | +5.0 |" in lines
    assert "**Unfinished or not run:** d64, 4 layers n=250: 1/3 seeds; d64, 4 layers n=1,438: 0/3 seeds (" in (
        "\n".join(lines)
    )


def test_evidence_reads_the_cells(sd, sweep_root):
    cells = sd.summarise_sizes(sweep_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    text = "\n".join(sd.evidence(cells, {"pad-crop": [{"gap": -0.01}, {"gap": 0.03}]}))
    assert "SSOG is clearly ahead (mean gap above one std, every seed) at d64, 4 layers, 500 images (+8.0 ± 2.0" in text
    assert "Seed 0 here (our own stratified 500): 80.0% vs 70.0% (+10.0); over 3 seeds 8.0 ± 2.0 points." in text
    assert "SSOG 85.1% vs dot 70.2% (+14.9 points)" in text
    fit = (
        "d64, 4 layers, 250: SSOG 90.0 − 50.0, dot 100.0 − 55.0; d64, 4 layers, 500: SSOG 96.7 − 85.3, dot 99.7 − 77.3."
    )
    assert fit in text
    assert "matched CPU time (points): d64, 4 layers, 250: -5.0; d64, 4 layers, 500: -1.7 ± 16.1." in text
    assert (
        "(points): d64, 4 layers, 250: 0.0 / 0.0 / -5.0; d64, 4 layers, 500: 10.0 ± 10.0 / 16.7 ± 11.5 / 8.3 ± 2.9."
        in (text)
    )
    assert (
        "* Present configuration: Read off the table: `pad-crop`: SSOG ahead by 1.0 points, within one std (2.8)"
        in text
    )
    assert "4 layers, 1,438" not in text  # a cell without runs says nothing


def test_reading_says_where_the_advantage_lives_and_why(sd, sweep_root):
    cells = sd.summarise_sizes(sweep_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    present = {"pad-crop": [{"gap": -0.01}, {"gap": 0.03}], "resized-crop": [{"gap": -0.03}, {"gap": -0.01}]}
    text = "\n".join(sd.reading(cells, present))
    assert "SSOG is ahead at every seed, by more than the seed spread, at 500 images (8.0 ± 2.0) (d64" in text
    vanish = "**Where it vanishes.** In the present configuration (d32, 2 layers, 1,438 images, 12×12, batch 128: "
    assert vanish + "`pad-crop` 1.0 ± 2.8, `resized-crop` -2.0 ± 1.4): the gap is within" in text
    assert "250 images" not in text  # one seed: not read
    # clean train − val: SSOG 96.7 − 85.3 = 11.4, dot 99.7 − 77.3 = 22.4 points: both above 10, both over-fit
    assert "500 images: SSOG over-fits (clean train 96.7%, val 85.3%), dot over-fits (clean train 99.7%" in text
    assert "far ahead: 8.0 ± 2.0 points at 500 images" in text and "matched CPU time (-1.7 ± 16.1)" in text
    assert "(40 vs 33 CPU s a run)" in text and "under-fits" not in text
    contra = "**What contradicts it.**\n\n* Under the Inception resized crop (present configuration) the dot twin is "
    assert contra + "ahead by 2.0 ± 1.4 points" in text
    for r in cells[1]["rows"]:
        r["dot_train"] = 0.70  # a dot twin that has not fitted its own training images
    text = "\n".join(sd.reading(cells, {}))
    assert "dot under-fits (clean train 70.0%, val 77.3%)" in text and "it under-fits (clean train 70.0%)" in text
    assert "Where it vanishes" not in text and "resized crop" not in text
    assert sd.reading([c for c in cells if c["n"] != 500], present) == []  # nothing with two seeds: nothing read


def test_the_gap_at_the_step_mark(sd):
    a = {"steps": [300, 600, 900], "val_acc": [0.1, 0.5, 0.8]}
    b = {"steps": [300, 600, 900], "val_acc": [0.1, 0.4, 0.6]}
    assert sd.STEP_MARK == 700
    assert sd._at_mark(a, b) == {"step": 600, "gap": pytest.approx(0.1)}  # 600 is nearer 700 than 900
    assert sd._at_mark({"steps": [300, 699], "val_acc": [0.1, 0.2]}, b) is None  # the run never got there


def test_the_gap_read_against_size_and_steps(sd):
    def row(gap: float, steps: int, mark: float | None = None) -> dict:
        return {"gap": gap, "steps": steps, "at_mark": None if mark is None else {"step": 704, "gap": mark}}

    full = {"arch": "d64-L4", "n": 1438, "epochs": None, "rows": [row(0.10, 2200, 0.17), row(0.12, 2200, 0.19)]}
    at500 = {"arch": "d64-L4", "n": 500, "epochs": None, "rows": [row(0.18, 700, 0.18), row(0.20, 700, 0.20)]}
    present = {"pad-crop": [{"gap": -0.01}, {"gap": 0.01}]}
    (text,) = sd._against_the_post([full], present, [])
    assert (
        "on all 1,438 images d64 / 4 layers still leads by 11.0 ± 1.4 points, while the present configuration" in text
    )
    assert "shows 0.0 ± 1.4; which of those differences removes it is not separated here." in text
    assert sd._against_the_post([full], {"pad-crop": [{"gap": 0.10}, {"gap": 0.12}]}, []) == []  # both clear
    (steps,) = sd._data_or_steps([at500, full])
    assert "fewer steps (500: 700, 1,438: 2,200). At 500 images the final gap (700 steps) is 19.0 ± 1.4." in steps
    assert "after the epoch ending at step 704 (their learning rate still high), stand at 18.0 ± 1.4 (2 seeds)" in steps
    assert steps.endswith("more than how many images there are.")  # 18 vs 19 at ~700 steps; 11 at the end
    full["rows"] = [row(0.10, 2200, 0.05), row(0.12, 2200, 0.07)]  # at ~700 steps far below the 500-image gap
    assert "Read together" not in sd._data_or_steps([at500, full])[0]


def _cell(gaps: list[float], n: int = 500, arch: str = "d64-L4") -> dict:
    """A cell holding only the paired gaps, all the verdict reads."""
    return {"arch": arch, "n": n, "rows": [{"gap": g} for g in gaps]}


@pytest.mark.parametrize(
    ("gaps", "reads"),
    [
        ([0.10, 0.06, 0.08], "SSOG is clearly ahead (mean gap above one std, every seed) at d64, 4 layers, 500 images "
         "(+8.0 ± 2.0, 3/3 seeds)."),
        ([0.10, -0.01, 0.12], "the gap is within the seed spread at d64, 4 layers, 500 images (+7.0 ± 7.0, 2/3 seeds)"),
        ([0.20, 0.01, 0.02], "the gap is within the seed spread at d64, 4 layers, 500 images (+7.7 ± 10.7, 3/3 seeds)"),
        ([-0.05, -0.06, -0.04], "the dot twin is clearly ahead at d64, 4 layers, 500 images (-5.0 ± 1.0, 0/3 seeds)"),
        ([0.30], "Too few finished seeds for a verdict."),
    ],
    ids=["clear", "mean-equals-std", "one-seed-carries-it", "dot-clear", "one-seed"],
)  # fmt: skip
def test_sizes_verdict_calls_a_lead_clear_only_beyond_the_spread_at_every_seed(sd, gaps, reads):
    verdict = sd.sizes_verdict([_cell(gaps), _cell([0.5], n=250)])  # a one-seed cell is never read
    assert reads in verdict and "250 images" not in verdict


def test_plot_gap_writes_a_png_with_or_without_runs(sd, sweep_root, tmp_path):
    cells = sd.summarise_sizes(sweep_root, ["d64-L4", "d32-L2"], list(sd.SWEEP_SIZES), SEEDS)
    present = {"pad-crop": [{"gap": -0.01}, {"gap": 0.03}], "resized-crop": []}
    for name, (c, p) in {"full.png": (cells, present), "empty.png": ([], {})}.items():
        sd.plot_gap(c, p, tmp_path / name)
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and im.size == (768, 480)


def test_the_repository_results_md_holds_one_section_between_the_markers(sd):
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert text.count(sd.MARK_BEGIN) == text.count(sd.MARK_END) == 1  # else a rerun appends a second section
    assert text.index(sd.MARK_BEGIN) < text.index(sd.MARK_END)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("# Results\n\nabove\n\nMARK\n\nbelow, kept\n", "# Results\n\nabove\n\nSECTION\n\nbelow, kept\n"),
        ("# Results\n\nbody\n\n\n", "# Results\n\nbody\n\nSECTION\n"),
        (None, "SECTION\n"),
    ],
    ids=["replaced", "appended", "new-file"],
)
def test_write_reports_places_the_section_and_writes_the_numbers(sd, fake_root, tmp_path, before, after):
    write_sweep_runs(sd, fake_root)
    docs = tmp_path / "docs"
    docs.mkdir()
    old = f"{sd.MARK_BEGIN}\n## an older section\n\n* stale numbers\n{sd.MARK_END}"
    if before is not None:
        (docs / "RESULTS.md").write_text(before.replace("MARK", old))
    (fake_root / "digits").mkdir()
    (fake_root / "digits" / "manifest.json").write_text(json.dumps(MANIFEST))  # a built tree: nothing to build
    results = tmp_path / "results"
    sd.write_reports(fake_root, SEEDS, 4, docs, ["d64-L4"], results)
    table = sd.summarise(fake_root, SEEDS)
    cells = sd.summarise_sizes(fake_root, ["d64-L4"], list(sd.SWEEP_SIZES), SEEDS)
    section = sd.results_section(cells, table, SEEDS)
    assert (docs / "RESULTS.md").read_text() == after.replace("SECTION", section)
    sd.write_reports(fake_root, SEEDS, 4, docs, ["d64-L4"], results)  # a second write replaces its own section
    assert (docs / "RESULTS.md").read_text() == after.replace("SECTION", section)
    assert json.loads((results / "small_data.json").read_text()) == json.loads(
        json.dumps({"data": MANIFEST, "epochs": 4, "runs": table})
    )
    sweep = json.loads((results / "small_data_sizes.json").read_text())
    assert sweep["cells"] == json.loads(json.dumps(cells))
    assert (docs / "SMALL_DATA.md").read_text() == sd.markdown_all(cells, table, MANIFEST, 4, SEEDS, SEEDS)
    assert sorted(str(p.relative_to(docs)) for p in docs.rglob("*") if p.is_file()) == [
        "RESULTS.md", "SMALL_DATA.md", "figures/small_data_gap.png",
    ]  # fmt: skip
    assert sorted(p.name for p in results.iterdir()) == ["small_data.json", "small_data_sizes.json"]
    bullet = "* d64, 4 layers, 500 images (16×16, batch 64, pad-crop 2): SSOG 85.3 ± 5.0%, dot 77.3 ± 6.4%, "
    assert bullet + "paired gap 8.0 ± 2.0 points; clean train 96.7 ± 1.5% vs 99.7 ± 0.6% (3 of 3 seeds)." in section


def test_write_reports_keeps_the_present_configuration_when_its_runs_are_gone(sd, sweep_root, tmp_path):
    """Only experiments/results/small_data.json holds the present configuration's numbers: a report without its runs
    keeps them."""
    docs, results = tmp_path / "docs", tmp_path / "results"
    sd.write_reports(sweep_root, SEEDS, 100, docs, ["d64-L4"], results)
    saved = json.loads((ROOT / "experiments" / "results" / "small_data.json").read_text())
    assert json.loads((results / "small_data.json").read_text()) == saved
    text = (docs / "SMALL_DATA.md").read_text()
    want = sd.markdown(saved["runs"], saved["data"], saved["epochs"], [0, 1, 2])
    assert text.endswith(want) and "## The SSOG post's regime in miniature: training-set size" in text
    assert text.index("## What the numbers say") < text.index("## The SSOG post's regime") < text.index(want)


def test_main_report_only_writes_the_reports_where_asked(sd, fake_root, tmp_path, monkeypatch, capsys):
    write_sweep_runs(sd, fake_root)
    (fake_root / "digits").mkdir()
    (fake_root / "digits" / "manifest.json").write_text(json.dumps(MANIFEST))  # a built tree: nothing to build
    built = []
    monkeypatch.setattr(sd, "build_sweep_data", lambda root, sizes: built.append((root, sizes)))

    def no_training(*args: object) -> str:
        raise AssertionError(f"--report-only trained {args}")

    monkeypatch.setattr(sd, "train_and_evaluate", no_training)
    monkeypatch.setattr(sd, "sweep_run", no_training)
    docs, results = tmp_path / "out" / "docs", tmp_path / "out" / "results"
    argv = ["--root", str(fake_root), "--seeds", "0", "1", "2", "--epochs", "4", "--report-only", "--docs", str(docs)]
    assert sd.main([*argv, "--results", str(results)]) == 0
    assert built == [(fake_root, sd.SWEEP_SIZES)]
    printed = capsys.readouterr().out
    assert str(docs) in printed and str(results) in printed
    text = (docs / "SMALL_DATA.md").read_text()
    assert "1438 train / 359 val images" in text and ", 4 epochs," in text
    assert "| `pad-crop` | 3 | 92.0 ± 2.0 | 87.0 ± 2.6 | 5.0 ± 1.0 | 5.3 ± 10.1 | 73, 70 |" in text
    assert "| d64, 4 layers | 500 | 3 | 85.3 ± 5.0 | 77.3 ± 6.4 | 8.0 ± 2.0 |" in text
    saved = json.loads((results / "small_data.json").read_text())
    assert saved["data"] == MANIFEST and saved["epochs"] == 4
    assert [r["seed"] for r in saved["runs"]["resized-crop"]] == [0, 1]
    results = (docs / "RESULTS.md").read_text()
    assert results.startswith(sd.MARK_BEGIN) and "it appears under `pad-crop`." in results


def test_main_runs_the_sweep_in_the_order_asked(sd, tmp_path, monkeypatch):
    """Sizes in the order given (the one that matters most first), seed by seed, both models of a pair together."""
    ran: list[tuple] = []
    monkeypatch.setattr(sd, "build_sweep_data", lambda root, sizes: None)
    monkeypatch.setattr(sd, "sweep_run", lambda *args: ran.append(args[1:]) or "done")
    monkeypatch.setattr(sd, "train_and_evaluate", lambda *args: pytest.fail("--study sizes trained the crops"))
    monkeypatch.setattr(sd, "write_reports", lambda *args: None)
    argv = ["--root", str(tmp_path), "--study", "sizes", "--sizes", "500", "250", "--seeds", "0", "1", "--jobs", "1"]
    assert sd.main([*argv, "--epochs", "7"]) == 0
    assert ran == [("d64-L4", n, m, s, 7) for n in (500, 250) for s in (0, 1) for m in ("ssog", "dot")]
    ran.clear()
    assert sd.main([*argv, "--matched-steps"]) == 0  # the step-matched run after the grid, 32 epochs of 1,438 images
    assert ran[8:] == [("d64-L4", 1438, m, s, 32, True) for s in (0, 1) for m in ("ssog", "dot")]


# ------------------------------------------------------------------------------------------------ the runner


def _tiny_tree(digits: Path, out: Path) -> Path:
    """13 train (one batch of 128 needs 128) and 2 val images per digit, copied from the full tree."""
    for split, n in (("train", 13), ("val", 2)):
        for label in range(10):
            (out / split / str(label)).mkdir(parents=True)
            for path in sorted((digits / split / str(label)).glob("*.png"))[:n]:
                shutil.copy(path, out / split / str(label) / path.name)
    return out


def _stamps(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in out.iterdir()}


@pytest.mark.slow
def test_runner_trains_skips_evaluates_and_resumes(sd, digits_tree, tmp_path):
    root = tmp_path / "small_data"
    data = _tiny_tree(digits_tree, root / "digits")
    out = sd.run_dir(root, "resized-crop", "dot", 3)

    assert sd.train_and_evaluate(root, data, "resized-crop", "dot", 3, 1) == f"{out}: done"
    config, _, meta = read_checkpoint(out / "model.safetensors")
    assert config.attn == "dot" and config.img_size == (12, 12) and config.dim == 32 and config.depth == 2
    assert meta["augment"] == ["resized-crop"] and meta["epochs_planned"] == 1 and "--seed 3" in meta["command"]
    result = sd._run_result(out)  # the report reads what train and evaluate really wrote
    assert result["accuracy"] == json.loads((out / "eval.json").read_text())[0]["accuracy"]
    assert len(result["val_acc"]) == len(result["cpu_s"]) == 1 and len(result["transfer"]) == len(SIZES)
    assert json.loads((out / "cpu_s.json").read_text())["train"] > 0

    finished = _stamps(out)
    assert sd.train_and_evaluate(root, data, "resized-crop", "dot", 3, 1) == f"{out}: done"
    assert _stamps(out) == finished  # a finished run is skipped: nothing runs, nothing is written

    (out / "eval.json").unlink()
    log_lines = len((out / "log.txt").read_text().splitlines())
    assert sd.train_and_evaluate(root, data, "resized-crop", "dot", 3, 1) == f"{out}: done"
    new_lines = (out / "log.txt").read_text().splitlines()[log_lines:]
    assert new_lines == [f"accuracy: {result['accuracy']:.4f}"]  # evaluated only
    assert (out / "eval.json").is_file() and sd._run_result(out)["accuracy"] == result["accuracy"]
    assert {k: v for k, v in _stamps(out).items() if k not in ("eval.json", "log.txt")} == {
        k: v for k, v in finished.items() if k not in ("eval.json", "log.txt")
    }

    # a run stopped before its final model (train_state.pt, no model.safetensors) continues with --resume; here the
    # finished run's state, its final model removed, and the CPU time of an earlier part set to a known 1000 s
    (out / "model.safetensors").unlink()
    (out / "eval.json").unlink()
    (out / "cpu_s.json").write_text(json.dumps({"train": 1000.0}))
    assert sd.train_and_evaluate(root, data, "resized-crop", "dot", 3, 1) == f"{out}: done"
    assert "resuming at step 1" in (out / "log.txt").read_text()
    assert json.loads((out / "cpu_s.json").read_text())["train"] > 1000.0  # CPU time adds up over the parts
    assert (out / "model.safetensors").is_file() and (out / "eval.json").is_file()


@pytest.mark.slow
def test_runner_reports_a_failed_training_and_does_not_evaluate(sd, digits_tree, tmp_path):
    root = tmp_path / "small_data"
    data = root / "digits"
    for split in ("train", "val"):  # 10 train images: fewer than one batch, which train refuses
        for label in range(10):
            (data / split / str(label)).mkdir(parents=True)
            shutil.copy(next((digits_tree / split / str(label)).glob("*.png")), data / split / str(label))
    out = sd.run_dir(root, "pad-crop", "ssog", 0)
    message = sd.train_and_evaluate(root, data, "pad-crop", "ssog", 0, 1)
    assert message == f"{out}: train exited 2 (see {out / 'log.txt'})"
    assert "fewer than one batch" in (out / "log.txt").read_text()
    assert not (out / "eval.json").exists() and json.loads((out / "cpu_s.json").read_text())["train"] > 0


def test_sweep_run_trains_with_the_recipe_evaluates_twice_skips_and_resumes(sd, tmp_path, monkeypatch):
    """The sweep's commands, with a stand-in for the subprocess that leaves the files train and evaluate leave."""
    calls: list[list[str]] = []

    def fake_cpu_run(cmd: list[str], log: Path) -> tuple[int, float]:
        calls.append(cmd)
        out = Path(cmd[cmd.index("--out") + 1]) if "--out" in cmd else None
        if "ssog_core.train" in cmd:
            (out / "train_state.pt").write_bytes(b"")
            if "--stop" not in cmd:
                (out / "model.safetensors").write_bytes(b"")
        else:
            Path(cmd[cmd.index("--json") + 1]).write_text("[]")
        return 0, 2.5

    monkeypatch.setattr(sd, "_cpu_run", fake_cpu_run)
    root = tmp_path / "small_data"
    data = sd.sweep_data(root, 500)
    (data / "train" / "0").mkdir(parents=True)
    out = sd.sweep_dir(root, "d64-L4", 500, "dot", 2)
    assert out == root / "runs" / "sizes" / "d64-L4" / "n500" / "dot-s2"

    assert sd.sweep_run(root, "d64-L4", 500, "dot", 2, 100) == f"{out}: done"
    train, val, clean = calls
    assert train[1:3] == ["-m", "ssog_core.train"] and train[-2:] == ["--out", str(out)]
    args = train[3:-2]
    assert args[: args.index("--img-size")] == [
        "--data", f"imagefolder:{data}", "--attn", "dot", "--epochs", "100", "--seed", "2"
    ]  # fmt: skip
    pairs = {k: args[args.index(k) + 1] for k in args if k.startswith("--") and k != "--no-progress"}
    assert {k: pairs[k] for k in ("--img-size", "--patch-size", "--dim", "--depth", "--heads", "--batch-size")} == {
        "--img-size": "16", "--patch-size": "2", "--dim": "64", "--depth": "4", "--heads": "4", "--batch-size": "64"
    }  # fmt: skip
    assert (pairs["--lr"], pairs["--warmup-epochs"], pairs["--augment"], pairs["--crop-pad"]) == (
        "1e-3",
        "2",
        "pad-crop",
        "2",
    )
    model = str(out / "model.safetensors")
    assert val[1:6] == ["-m", "ssog_core", "evaluate", "--checkpoint", model] and "--data" not in val
    assert val[-2:] == ["--json", str(out / "eval.json")]
    view = root / "digits16-n500-train-view"
    assert clean[6:8] == ["--data", f"imagefolder:{view}"] and clean[-2:] == ["--json", str(out / "train_eval.json")]
    assert (view / "val").resolve() == (data / "train").resolve()
    assert json.loads((out / "cpu_s.json").read_text()) == {"train": 2.5}

    calls.clear()
    assert sd.sweep_run(root, "d64-L4", 500, "dot", 2, 100) == f"{out}: done" and calls == []  # finished: skipped
    (out / "train_eval.json").unlink()
    assert sd.sweep_run(root, "d64-L4", 500, "dot", 2, 100) == f"{out}: done"
    assert [c[-1] for c in calls] == [str(out / "train_eval.json")]  # only the missing evaluation

    calls.clear()
    (out / "model.safetensors").unlink()  # stopped: a train_state.pt and no final model
    (out / "eval.json").unlink()
    assert sd.sweep_run(root, "d64-L4", 500, "dot", 2, 100) == f"{out}: done"
    assert calls[0][3:] == ["--out", str(out), "--resume", "--device", "cpu", "--workers", "0", "--no-progress"]
    assert [c[-1] for c in calls[1:]] == [str(out / "eval.json")]
    assert json.loads((out / "cpu_s.json").read_text()) == {"train": 5.0}  # CPU time adds up over the parts


def test_a_run_goes_niced_one_thread_in_a_session_of_its_own_and_its_cpu_time_counts(sd, tmp_path):
    """Each run is a child run (``ssog_core.train.child_runs``): its own session, so the study's stop reaches it through
    the launcher and a killed study takes it along; niced; one thread; CPU seconds measured."""
    probe = (
        "import os, time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass\n"
        "print(os.getsid(0) != os.getpid(), os.getsid(0), os.nice(0), os.environ['OMP_NUM_THREADS'])"
    )
    code, cpu = sd._cpu_run([sys.executable, "-c", probe], tmp_path / "log.txt")
    in_own_session, session, nice, threads = (tmp_path / "log.txt").read_text().split()
    assert code == 0 and 0.2 <= cpu < 5
    assert in_own_session == "True" and int(session) != os.getsid(0)  # led by the watchdog around the run
    assert int(nice) == min(os.nice(0) + sd.NICE, 19) and threads == "1"

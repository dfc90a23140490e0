"""Data sources: the shapes set, CIFAR-100 in its real format (read safely), ImageFolder, augmentation, sampling."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
from PIL import Image

from ssog_core.data import layouts
from ssog_core.data.layouts import LayoutsDataset, LayoutsSpec
from ssog_core.data.shapes import CLASS_NAMES, ShapesDataset, ShapesSpec, _mask, render
from ssog_core.data.sources import (
    ArrayDataset,
    DataError,
    EpochSampler,
    FolderDataset,
    ShardSampler,
    Transformed,
    cifar100,
    describe_transforms,
    imagefolder,
    load_cifar_pickle,
    open_data,
    parse_augment,
    parse_data_spec,
    resolve_augment,
)
from tests.data_files import cifar_batch, write_cifar, write_cifar_tar, write_imagefolder

# ----------------------------------------------------------------------------------------------- shapes


def test_shapes_deterministic_per_seed_and_index():
    spec = ShapesSpec.parse("classes=6,train=50,val=20,seed=3")
    a, b = ShapesDataset(spec, "train", (24, 40)), ShapesDataset(spec, "train", (24, 40))
    img, label = a[17]
    assert img.shape == (24, 40, 3) and img.dtype == np.uint8
    assert label == 17 % 6
    np.testing.assert_array_equal(img, b[17][0])
    assert not np.array_equal(img, a[18][0])
    other_seed = ShapesDataset(ShapesSpec.parse("classes=6,seed=4"), "train", (24, 40))
    assert not np.array_equal(img, other_seed[17][0])
    val = ShapesDataset(spec, "val", (24, 40))
    assert len(val) == 20 and not np.array_equal(img, val[17][0])
    with pytest.raises(IndexError):
        a[50]


def test_shapes_any_resolution_same_scene():
    """Rendering at another size gives the same scene (same label, similar layout), not a different image."""
    small, _ = render(0, "val", 5, 10, (32, 32))
    big, _ = render(0, "val", 5, 10, (96, 96))
    assert big.shape == (96, 96, 3)
    down = big.reshape(32, 3, 32, 3, 3).mean(axis=(1, 3))
    assert np.abs(down - small.astype(np.float64)).mean() < 25  # same content up to resampling


def test_shapes_objects_vary_and_are_often_off_centre():
    """Masks of the objects: every class draws something, sizes vary, and many sit away from the centre."""
    rng = np.random.default_rng(0)
    offsets, areas = [], []
    for label in range(len(CLASS_NAMES)):
        for _ in range(6):
            m = _mask(label, rng, (48, 48))
            assert m.min() >= 0.0 and m.max() <= 1.0
            ys, xs = np.nonzero(m > 0.5)
            assert len(ys) > 15, CLASS_NAMES[label]
            offsets.append(np.hypot(ys.mean() - 23.5, xs.mean() - 23.5))
            areas.append(m.sum())
    assert np.mean(np.array(offsets) > 8) > 0.3
    assert max(areas) > 2.5 * min(areas)
    assert ShapesDataset(ShapesSpec.parse("classes=12"), "val").class_names == list(CLASS_NAMES)


@pytest.mark.parametrize(
    "text, message",
    [
        ("classes=1", "between 2"),
        ("classes=99", "between 2"),
        ("train=0", "train >= 1"),
        ("size=4", "size >= 8"),
        ("colour=3", "key one of"),
        ("classes=ten", "not an integer"),
        ("classes", "key=value"),
    ],
)
def test_shapes_spec_errors(text, message):
    with pytest.raises(ValueError, match=message):
        ShapesSpec.parse(text)


# ---------------------------------------------------------------------------------------------- layouts


def test_layouts_deterministic_per_seed_split_and_index():
    spec = LayoutsSpec.parse("classes=10,train=40,val=20,seed=2")
    a, b = LayoutsDataset(spec, "train", (40, 72)), LayoutsDataset(spec, "train", (40, 72))
    img, label = a[13]
    assert img.shape == (40, 72, 3) and img.dtype == np.uint8 and isinstance(label, int)
    np.testing.assert_array_equal(img, b[13][0])  # a fresh data set object: the same pixels
    assert not np.array_equal(img, a[14][0])
    assert not np.array_equal(img, LayoutsDataset(spec, "val", (40, 72))[13][0])
    other = LayoutsDataset(LayoutsSpec.parse("classes=10,seed=3"), "train", (40, 72))
    assert not np.array_equal(img, other[13][0])
    shapes_twin = ShapesDataset(ShapesSpec.parse("classes=10,seed=2"), "train", (40, 72))
    assert not np.array_equal(img, shapes_twin[13][0])  # its own random stream, not the shapes set's
    with pytest.raises(IndexError):
        a[40]
    with pytest.raises(ValueError, match="split"):
        LayoutsDataset(spec, "test")


def test_layouts_labels_balanced_and_sizes_odd():
    spec = LayoutsSpec.parse("classes=7,train=23,val=14")
    train = LayoutsDataset(spec, "train", (40, 72))
    labels = [train[i][1] for i in range(len(train))]
    counts = np.bincount(labels, minlength=7)
    assert counts.max() - counts.min() <= 1 and set(labels) == set(range(7))
    assert train.class_names == list(layouts.CLASS_NAMES[:7])
    tall = LayoutsDataset(spec, "val", (72, 40))
    assert tall[3][0].shape == (72, 40, 3) and len(tall) == 14
    assert LayoutsDataset(spec, "val")[0][0].shape == (56, 56, 3)  # the spec's native size


@pytest.mark.parametrize("size", [(40, 72), (72, 40), (24, 24)])
def test_layouts_every_class_draws_inside_the_image(size):
    """The object's coverage mask: something of every class is visible, and the picture shows it there."""
    for index in range(30):  # three draws of each of the 10 classes
        img, label, alpha = layouts.render_with_mask(5, "train", index, 10, size)
        assert alpha.shape == size and alpha.dtype == np.float32
        assert alpha.min() >= 0.0 and alpha.max() <= 1.0
        assert alpha.sum() > 4.0, (layouts.CLASS_NAMES[label], size)  # a few full pixels at least
        assert (alpha > 0.5).any()
        assert img.shape == (*size, 3)


def test_layouts_through_open_data_and_spec_errors():
    source = open_data("layouts:classes=4,train=8,val=4", (24, 40))
    assert source.kind == "layouts" and source.num_classes == 4 and source.native_size == (24, 40)
    assert source.val[1][0].shape == (24, 40, 3)
    assert open_data("layouts:classes=3,train=4,val=4").native_size == (56, 56)
    assert parse_data_spec("layouts:classes=10") == ("layouts", "classes=10")
    for text, message in (
        ("layouts:classes=11", "between 2 and 10"),
        ("layouts:classes=1", "between 2"),
        ("layouts:val=0", "val >= 1"),
        ("layouts:shape=1", "key one of"),
        ("layouts:size=big", "not an integer"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_data_spec(text)


# ------------------------------------------------------------------------------------------------ CIFAR


@pytest.mark.parametrize("protocol", [2, 4])
def test_cifar_folder(tmp_path, protocol):
    folder = write_cifar(tmp_path, n_train=12, n_test=8, num_classes=4, protocol=protocol)
    train, test, names = cifar100(tmp_path)  # the parent folder works too
    assert names == ["class0", "class1", "class2", "class3"]
    assert len(train) == 12 and len(test) == 8
    img, label = train[5]
    assert img.shape == (32, 32, 3) and img.dtype == np.uint8 and label == 1
    # channel-first rows of 1024 values, as the official files store them
    raw = pickle.loads(cifar_batch(12, 4, 0, protocol))[b"data"][5]
    np.testing.assert_array_equal(img[..., 0].ravel(), raw[:1024])
    np.testing.assert_array_equal(img[..., 2].ravel(), raw[2048:])
    assert cifar100(folder)[2] == names


def test_cifar_tar(tmp_path):
    path = write_cifar_tar(tmp_path, n_train=10, n_test=6, num_classes=3)
    train, test, names = cifar100(path)
    assert (len(train), len(test), len(names)) == (10, 6, 3)
    source = open_data(f"cifar100:{path}")
    assert source.native_size == (32, 32) and source.num_classes == 3


class _Exploit:
    """A pickle payload that would create a folder when unpickled by a plain ``pickle.load``."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (os.mkdir, (self.target,))


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({b"data": _Exploit(str(marker)), b"fine_labels": []}, protocol=2)
    with pytest.raises(DataError, match="refusing to load posix.mkdir|refusing to load os.mkdir"):
        load_cifar_pickle(payload, "train")
    assert not marker.exists()
    # the same payload in place of a real file: the loader refuses the whole data set
    folder = write_cifar(tmp_path / "c", n_train=4, n_test=4, num_classes=2)
    (folder / "train").write_bytes(payload)
    with pytest.raises(DataError, match="not a safe CIFAR-100 pickle"):
        cifar100(folder)
    assert not marker.exists()


def test_cifar_pickle_other_globals_refused():
    evil = pickle.dumps(np.load, protocol=2)  # a numpy global that is not array reconstruction
    with pytest.raises(DataError, match="refusing to load numpy"):
        load_cifar_pickle(evil, "meta")


def test_cifar_bad_files(tmp_path):
    folder = write_cifar(tmp_path, n_train=4, n_test=4, num_classes=2)
    (folder / "test").write_bytes(b"\x80\x02}q\x00(")  # truncated
    with pytest.raises(DataError, match="truncated or corrupt"):
        cifar100(folder)
    (folder / "test").write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"fine_labels": [0, 1]}))
    with pytest.raises(DataError, match=r"\(N, 3072\)"):
        cifar100(folder)
    (folder / "meta").unlink()
    with pytest.raises(DataError, match="no meta file"):
        cifar100(folder)
    with pytest.raises(DataError, match="no such file"):
        cifar100(tmp_path / "missing")


# ------------------------------------------------------------------------------------------ ImageFolder


def test_imagefolder(tmp_path):
    write_imagefolder(tmp_path, classes=3, per_class=4, val_per_class=2)
    train, val, names = imagefolder(tmp_path)
    assert names == ["c0", "c1", "c2"] and len(train) == 12 and len(val) == 6
    size = (24, 20)
    t = Transformed(train, size, ("resized-crop", "flip"), seed=1)
    a, label = t[(3, 0)]
    assert a.shape == (24, 20, 3) and a.dtype == np.uint8 and label == 0
    np.testing.assert_array_equal(a, t[(3, 0)][0])  # same (seed, epoch, index): same crop
    e, _ = Transformed(val, size)[4]
    assert e.shape == (24, 20, 3)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(DataError, match="train/CLASS"):
        imagefolder(tmp_path)
    write_imagefolder(tmp_path, classes=2, per_class=2, val_per_class=1)
    (tmp_path / "val" / "zebra").mkdir()
    with pytest.raises(DataError, match="train/ lacks: zebra"):
        imagefolder(tmp_path)
    (tmp_path / "val" / "zebra").rmdir()
    for p in (tmp_path / "train" / "c1").iterdir():
        p.unlink()
    with pytest.raises(DataError, match="no images"):
        imagefolder(tmp_path)


def test_imagefolder_corrupt_file_named(tmp_path):
    write_imagefolder(tmp_path, classes=2, per_class=2, val_per_class=1)
    (tmp_path / "train" / "c0" / "0.png").write_bytes(b"not an image")
    train, _, _ = imagefolder(tmp_path)
    with pytest.raises(DataError, match="0.png"):
        train[0]


# ---------------------------------------------------------------------------------- augmentation, sampling


def test_pad_crop_flip_deterministic_and_varied():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    t = Transformed(ArrayDataset(images, np.arange(5)), (32, 32), ("pad-crop", "flip"), seed=7)
    outs = [t[(2, epoch)][0] for epoch in range(6)]
    assert all(o.shape == (32, 32, 3) for o in outs)
    np.testing.assert_array_equal(outs[0], t[(2, 0)][0])
    assert len({o.tobytes() for o in outs}) > 1
    # no augmentation: the image itself; evaluation keys are plain indices
    np.testing.assert_array_equal(Transformed(t.source, (32, 32))[2][0], images[2])
    # a crop of the zero-padded image: every output row is a shifted window of the original
    plain = Transformed(t.source, (32, 32), ("pad-crop",), seed=7)[(2, 0)][0]
    padded = np.pad(images[2], ((4, 4), (4, 4), (0, 0)))
    hits = [(y, x) for y in range(9) for x in range(9) if np.array_equal(padded[y : y + 32, x : x + 32], plain)]
    assert hits


def test_parse_and_resolve_augment():
    assert parse_augment("flip,pad-crop") == ("pad-crop", "flip")
    assert parse_augment("crop, flip") == ("crop", "flip")
    assert parse_augment("resized-crop") == ("resized-crop",)
    assert parse_augment("none") == ()
    for bad in ("pad-crop,resized-crop", "crop,pad-crop", "rotate", "flip,flip", "", "none,flip"):
        with pytest.raises(ValueError, match="at most one of crop"):
            parse_augment(bad)
    assert resolve_augment(("crop", "flip"), "imagefolder") == ("resized-crop", "flip")
    for kind in ("cifar100", "shapes", "layouts"):
        assert resolve_augment(["crop"], kind) == ("pad-crop",)
    assert resolve_augment(("pad-crop", "flip"), "imagefolder") == ("pad-crop", "flip")
    with pytest.raises(ValueError, match="resolve 'crop'"):
        Transformed(ArrayDataset(np.zeros((1, 8, 8, 3), np.uint8), np.zeros(1)), (8, 8), ("crop",))


def test_describe_transforms_names_what_runs():
    d = describe_transforms("imagefolder", ("pad-crop", "flip"), 2, (16, 16))
    assert d["train"].startswith("files of 16×16 used as they are") and "zero-pad 2 px" in d["train"]
    assert d["train"].endswith("horizontal flip (p=0.5)") and "flip" not in d["eval"]
    d = describe_transforms("imagefolder", ("resized-crop",), 4, (24, 20))
    assert d["train"].startswith("resized-crop (Inception: 25–100% of the area") and "24×20" in d["train"]
    assert describe_transforms("shapes", (), 4, (40, 40)) == {
        "train": "rendered natively at 40×40",
        "eval": "rendered natively at 40×40",
    }


def _write_png(path, a):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(a).save(path)


def test_evaluation_leaves_files_of_the_model_size_alone(tmp_path):
    """A file that already has the model's size is neither rescaled nor cropped (the old 1/0.875 zoom is gone);
    a file of another size is still resized and centre-cropped to fit."""
    rng = np.random.default_rng(3)
    exact = rng.integers(0, 256, size=(16, 12, 3), dtype=np.uint8)
    other = rng.integers(0, 256, size=(30, 40, 3), dtype=np.uint8)
    _write_png(tmp_path / "a.png", exact)
    _write_png(tmp_path / "b.png", other)
    val = Transformed(FolderDataset([(tmp_path / "a.png", 0), (tmp_path / "b.png", 1)]), (16, 12))
    np.testing.assert_array_equal(val[0][0], exact)
    b, label = val[1]
    assert b.shape == (16, 12, 3) and label == 1


def test_pad_crop_on_files_and_the_crop_pad(tmp_path):
    """pad-crop works on ImageFolder files too, with the padding asked for; resized-crop changes the content."""
    rng = np.random.default_rng(4)
    a = rng.integers(1, 256, size=(16, 16, 3), dtype=np.uint8)  # no zeros: padding shows up as zeros
    _write_png(tmp_path / "a.png", a)
    files = FolderDataset([(tmp_path / "a.png", 0)])
    for pad in (1, 3):
        t = Transformed(files, (16, 16), ("pad-crop",), seed=0, crop_pad=pad)
        outs = [t[(0, epoch)][0] for epoch in range(40)]
        padded = np.pad(a, ((pad, pad), (pad, pad), (0, 0)))
        shifts = set()
        for o in outs:
            hits = [(y, x) for y in range(2 * pad + 1) for x in range(2 * pad + 1)
                    if np.array_equal(padded[y : y + 16, x : x + 16], o)]  # fmt: skip
            assert hits, pad
            shifts.add(hits[0])
        assert max(max(abs(y - pad), abs(x - pad)) for y, x in shifts) == pad  # the full range is used
    resized = Transformed(files, (16, 16), ("resized-crop",), seed=0)
    assert any(not np.array_equal(resized[(0, e)][0], a) for e in range(5))
    assert not (Transformed(files, (16, 16), ("resized-crop",), seed=0)[(0, 1)][0] == 0).all(axis=-1).any()


def test_folder_dataset_decodes_once_within_its_cache(tmp_path):
    a = np.full((8, 8, 3), 7, np.uint8)
    _write_png(tmp_path / "a.png", a)
    cached, uncached = FolderDataset([(tmp_path / "a.png", 0)]), FolderDataset([(tmp_path / "a.png", 0)], 0)
    np.testing.assert_array_equal(np.asarray(cached[0][0]), a)
    np.testing.assert_array_equal(np.asarray(uncached[0][0]), a)
    (tmp_path / "a.png").unlink()
    np.testing.assert_array_equal(np.asarray(cached[0][0]), a)  # held in memory
    with pytest.raises(DataError, match="a.png"):
        uncached[0]  # over its budget of 0 bytes: read again, and the file is gone


def test_epoch_sampler_shards_and_skip():
    data = list(range(23))
    full = EpochSampler(data, 1, 0, seed=5)
    full.set_position(2)
    order = [i for i, _ in full]
    assert sorted(order) == data and all(e == 2 for _, e in full)
    full.set_position(3)
    assert [i for i, _ in full] != order  # reshuffled per epoch
    shards = [EpochSampler(data, 2, r, seed=5) for r in range(2)]
    for s in shards:
        s.set_position(2)
    got = [[i for i, _ in s] for s in shards]
    assert set(got[0]) | set(got[1]) == set(data)  # padded to equal length, nothing lost
    resumed = EpochSampler(data, 1, 0, seed=5)
    resumed.set_position(2, skip=8)
    assert [i for i, _ in resumed] == order[8:] and len(resumed) == 15
    assert list(ShardSampler(7, 1, 3)) == [1, 4]


def test_parse_data_spec_errors():
    assert parse_data_spec("cifar100:/x") == ("cifar100", "/x")
    assert parse_data_spec("shapes") == ("shapes", "")
    with pytest.raises(ValueError, match="KIND must be one of"):
        parse_data_spec("mnist:/x")
    with pytest.raises(ValueError, match="needs a path"):
        parse_data_spec("imagefolder")
    with pytest.raises(ValueError, match="key one of"):
        parse_data_spec("shapes:bogus=1")

"""Tiny data sets in the real on-disk formats, for the data, training and evaluation tests."""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def cifar_batch(n: int, num_classes: int, seed: int, protocol: int = 2) -> bytes:
    """A pickled CIFAR-100 batch: the keys and dtypes of the official python version."""
    rng = np.random.default_rng(seed)
    d = {
        b"filenames": [f"img_{i}.png".encode() for i in range(n)],
        b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [int(i % num_classes) for i in range(n)],
        b"coarse_labels": [int(i % 2) for i in range(n)],
        b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
    }
    return pickle.dumps(d, protocol=protocol)


def cifar_meta(num_classes: int, protocol: int = 2) -> bytes:
    d = {
        b"fine_label_names": [f"class{i}".encode() for i in range(num_classes)],
        b"coarse_label_names": [b"first", b"second"],
    }
    return pickle.dumps(d, protocol=protocol)


def write_cifar(root: Path, n_train: int = 48, n_test: int = 16, num_classes: int = 4, protocol: int = 2) -> Path:
    """``root/cifar-100-python/{train,test,meta}``; returns the ``cifar-100-python`` folder."""
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    (folder / "train").write_bytes(cifar_batch(n_train, num_classes, 0, protocol))
    (folder / "test").write_bytes(cifar_batch(n_test, num_classes, 1, protocol))
    (folder / "meta").write_bytes(cifar_meta(num_classes, protocol))
    return folder


def write_cifar_tar(root: Path, **kwargs) -> Path:
    """The same files packed like ``cifar-100-python.tar.gz``."""
    folder = write_cifar(root / "src", **kwargs)
    path = root / "cifar-100-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name in ("meta", "test", "train"):
            data = (folder / name).read_bytes()
            info = tarfile.TarInfo(f"cifar-100-python/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def write_imagefolder(root: Path, classes: int = 3, per_class: int = 6, val_per_class: int = 2) -> Path:
    """``root/train/CLASS/*.png|jpg`` and ``root/val/CLASS/*`` of varied sizes and modes."""
    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("val", val_per_class)):
        for c in range(classes):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                h, w = int(rng.integers(20, 50)), int(rng.integers(20, 50))
                a = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
                img = Image.fromarray(a)
                if i % 3 == 1:
                    img = img.convert("L")
                img.save(folder / f"{i}.{'jpg' if i % 2 else 'png'}")
    return root

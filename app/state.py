"""Process-wide resources of the app: the checkpoint folder, a bounded model cache and an image store.

Nothing here lives in ``gr.State`` (models do not deepcopy and would be duplicated per user). Every path a
request names is resolved inside the checkpoint folder (or the app's own upload folder) and refused
otherwise, so neither the picker nor the API can read files elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch import Tensor, nn

from ssog_core.analysis.measures import LayerField, layer_fields
from ssog_core.analysis.presets import Preset, find_presets
from ssog_core.analysis.session import NO_TWIN
from ssog_core.checkpoint.folder_zip import unpack_model_zip
from ssog_core.checkpoint.format import CheckpointError, load_checkpoint, save_checkpoint
from ssog_core.checkpoint.standard import HUB_PREFIX, folder_config
from ssog_core.checkpoint.standard import resolve as hub_folder
from ssog_core.checkpoint.upstream import convert
from ssog_core.data.images import MAX_BYTES, ImageError, list_images, load_image, model_input
from ssog_core.nn.config import FAMILY_NAMES
from ssog_core.runtime.folders import fingerprint
from ssog_core.runtime.lru import LRU

UPLOADED = "uploaded/"  # prefix of checkpoints a user uploaded in this session of the server
MAX_PIXELS = 25_000_000  # decoded-image cap for uploads (decompression bombs are refused before decoding)
DISPLAY_SIDE = 768  # images are kept at most this large for overlays: plenty for a figure, cheap to draw
MAX_UPLOADED_CHECKPOINTS = 8  # older uploads are deleted: disk use stays bounded however long the server runs
MODEL_CACHE = 4  # models kept in memory (a demo pair plus a comparison pair)
IMAGE_CACHE = 32
CARD_CACHE = 8  # model cards (counting FLOPs runs the model once)
FIGURE_CACHE = 8  # geometry figures as PNG bytes with their panel boxes
STEERING_CACHE = 3  # full attention matrices are the largest thing the app keeps: only a few
MAPS_CACHE = 8  # export maps, shared by the export and compare tabs and the API
VALIDATION_CACHE = 4  # validation images' maps for the control and the per-class view: the costliest to make
EFFECTS_CACHE = 16  # interventions: validation images, head means, effects and head-importance sweeps
HEAD_FIELDS_CACHE = 8  # models measured as fields: their charts share axes (a few small tensors each)


class AppError(ValueError):
    """A request the app refuses, with a message for the person who made it."""


@dataclass
class LoadedModel:
    """A checkpoint in memory with its cheap-to-keep derived views."""

    name: str
    key: tuple[str, int, int]  # (path, mtime_ns, size): a changed file is a different cache entry
    model: nn.Module
    meta: dict[str, Any]

    @property
    def config(self):
        return self.model.config

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def input(self, image: Image.Image) -> Tensor:
        """``image`` as this model's input batch, on the model's device (what the analysis functions take)."""
        x, _ = model_input([image], self.config.img_size, self.meta)
        return x.to(self.device)

    @property
    def is_ssog(self) -> bool:
        return self.config.attn == "ssog"

    @property
    def variant(self) -> str:
        """``ssog`` (steered), ``ssog_fixed`` (no content taps: the fixed field), ``dot`` or ``rbf``: the word a
        checkpoint's file name carries for its kind of model (``ssog_layouts``, ``ssog_fixed_layouts``)."""
        return "ssog_fixed" if self.is_ssog and not self.config.steer else self.config.attn

    @property
    def kind(self) -> str:
        """The attention in words, for messages, after the model's family unless it is one of the lab's own (a
        DINOv2 folder is a "DINOv2 dot-product" model)."""
        cfg = self.config
        attention = {"ssog": "SSOG", "dot": "dot-product", "rbf": "RBF (distance)"}.get(cfg.attn, cfg.attn)
        family = cfg.family
        return attention if family == "lab" else f"{FAMILY_NAMES.get(family, family)} {attention}"

    @property
    def class_names(self) -> list[str]:
        names = self.meta.get("class_names")
        if isinstance(names, list) and len(names) == self.config.num_classes:
            return [str(n) for n in names]
        return [f"class {i}" for i in range(self.config.num_classes)]

    @property
    def teacher(self) -> str | None:
        """The teacher a distilled student's metadata names (``distill.teacher``: a picker name, or the path the
        command line was given); None for any other model."""
        distilled = self.meta.get("distill")
        teacher = distilled.get("teacher") if isinstance(distilled, dict) else None
        return teacher if isinstance(teacher, str) and teacher else None

    @cached_property
    def fields(self) -> list[LayerField]:
        return layer_fields(self.model)

    @cached_property
    def presets(self) -> list[Preset]:
        return find_presets(self.fields) if self.fields else []


@dataclass
class StoredImage:
    sha256: str
    name: str
    image: Image.Image  # RGB, at most DISPLAY_SIDE on its longer side
    original_size: tuple[int, int]  # (width, height) of the file as decoded, for "size in → size used" notes


@dataclass
class Caches:
    """Every process cache of the app, each bounded (docs/APP.md, "State and caches"). Keys hold what the value
    depends on: a model's key changes with its file, an image's is the SHA-256 of its file."""

    models: LRU[LoadedModel] = field(default_factory=lambda: LRU(MODEL_CACHE))  # (path, mtime, size, name)
    images: LRU[StoredImage] = field(default_factory=lambda: LRU(IMAGE_CACHE))  # sha256
    cards: LRU[dict[str, Any]] = field(default_factory=lambda: LRU(CARD_CACHE))  # model key
    figures: LRU[Any] = field(default_factory=lambda: LRU(FIGURE_CACHE))  # (figure kind, model key)
    steering: LRU[Any] = field(default_factory=lambda: LRU(STEERING_CACHE))  # (model key, sha256)
    export_maps: LRU[Any] = field(default_factory=lambda: LRU(MAPS_CACHE))  # (model key, sha256, α[, control])
    validation: LRU[Any] = field(default_factory=lambda: LRU(VALIDATION_CACHE))  # (model key, N, α, blank)
    effects: LRU[Any] = field(default_factory=lambda: LRU(EFFECTS_CACHE))  # (what, model key, edits, N, ...)
    head_fields: LRU[Any] = field(default_factory=lambda: LRU(HEAD_FIELDS_CACHE))  # (name, model key, N, atoms)


@dataclass
class AppContext:
    """Where the app reads checkpoints and bundled images, its limits, and its caches: all the state the app
    keeps outside Gradio's per-session ``gr.State``."""

    checkpoint_dir: Path
    assets_dir: Path
    upload_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ssog-lab-uploads-")))
    max_pixels: int = MAX_PIXELS
    device: str = "cpu"  # where models and their analysis run (the playground's small field stays on the CPU)
    cache: Caches = field(default_factory=Caches)
    hub_names: list[str] = field(default_factory=list)  # hf-hub:ORG/NAME opened by this server, for the pickers

    def __post_init__(self) -> None:
        self.checkpoint_dir = Path(self.checkpoint_dir)
        self.assets_dir = Path(self.assets_dir)
        self.upload_dir = Path(self.upload_dir)

    # ------------------------------------------------------------------ checkpoints

    def checkpoint_names(self) -> list[str]:
        """Checkpoints the picker offers: ``*.safetensors`` in the folder, then its sub-folders holding a
        ``config.json`` (standard ViTs in timm's or transformers' layout), then this server's uploads (files and
        unpacked model folders)."""
        found = []
        if self.checkpoint_dir.is_dir():
            found += sorted(p.name for p in self.checkpoint_dir.glob("*.safetensors") if p.is_file())
            found += sorted(p.parent.name for p in self.checkpoint_dir.glob("*/config.json") if p.is_file())
        found += [UPLOADED + p.name for p in self._uploads()]
        return found + self.hub_names

    def _uploads(self) -> list[Path]:
        """This server's uploads by name: checkpoint files and unpacked model folders (hidden names, such as a
        folder still being unpacked, are not uploads)."""
        files = [p for p in self.upload_dir.glob("*.safetensors") if p.is_file()]
        folders = [p.parent for p in self.upload_dir.glob("*/config.json") if p.is_file()]
        return sorted(p for p in files + folders if not p.name.startswith("."))

    def checkpoint_label(self, name: str) -> str:
        """What the picker says beside a model folder's name: its layout and architecture from its JSON files
        (no weights read), or that it cannot be opened; empty for a checkpoint file."""
        try:
            path = self.resolve(name)
            if not path.is_dir():
                return ""
            config, about = folder_config(path)
        except (AppError, CheckpointError):
            return "cannot be opened: pick it to see why"
        return (
            f"{about['layout']} folder: {about['architecture']}, {config.depth} layers × {config.num_heads} heads, "
            f"{config.num_prefix_tokens} prefix token{'s' * (config.num_prefix_tokens != 1)}"
        )

    def resolve(self, name: str) -> Path:
        """The file behind a picker name; anything that would leave the checkpoint folder is refused. An
        ``hf-hub:ORG/NAME`` is its snapshot folder in the local Hugging Face cache (nothing is downloaded)."""
        if not isinstance(name, str) or not name.strip():
            raise AppError("no checkpoint selected")
        if name.startswith(HUB_PREFIX):
            try:
                return hub_folder(name)
            except CheckpointError as e:
                raise AppError(str(e)) from None
        if "\x00" in name or name.startswith(("/", "\\")) or Path(name).is_absolute() or ".." in Path(name).parts:
            raise AppError(f"refused checkpoint path {name!r}: pick a file inside the checkpoint folder")
        if name.startswith(UPLOADED):
            root, rel = self.upload_dir, name[len(UPLOADED) :]
        else:
            root, rel = self.checkpoint_dir, name
        if "/" in rel or "\\" in rel:
            raise AppError(f"refused checkpoint path {name!r}: sub-folders are not served")
        if root == self.upload_dir and rel.startswith("."):  # a folder still being unpacked
            raise AppError(f"checkpoint {name!r} not found in {root}")
        path = (root / rel).resolve()
        if not path.is_relative_to(root.resolve()):
            raise AppError(f"refused checkpoint path {name!r}: it points outside the checkpoint folder")
        folder = path.is_dir()  # a model folder (in the checkpoint folder, or an unpacked upload)
        if not (path.is_file() or folder):
            raise AppError(f"checkpoint {name!r} not found in {root}")
        if folder and any(not f.resolve().is_relative_to(path) for f in path.iterdir()):
            raise AppError(f"refused model folder {name!r}: a file in it points outside the folder")
        return path

    def model(self, name: str) -> LoadedModel:
        """The checkpoint ``name`` loaded (cached by path + modification time + size)."""
        key = fingerprint(self.resolve(name))  # a changed file is a different cache entry

        def load() -> LoadedModel:
            model, meta = load_checkpoint(key[0], self.device)
            model.requires_grad_(False)
            return LoadedModel(name, key, model, meta)

        try:
            loaded = self.cache.models.get((*key, name), load)
        except CheckpointError as e:
            raise AppError(str(e)) from None
        if name.startswith(HUB_PREFIX) and name not in self.hub_names:
            self.hub_names.append(name)  # opened once (picker, API or session): the pickers offer it from now on
        return loaded

    def offers(self, name: str) -> bool:
        """Whether the pickers offer ``name`` (a picker list name), or it is an ``hf-hub:`` name that opens from the
        local cache (from then on offered too): what a session or the API may name."""
        if name in self.checkpoint_names():
            return True
        if not name.startswith(HUB_PREFIX):
            return False
        try:
            self.model(name)
        except AppError:
            return False
        return True

    def open_hub(self, text: str) -> str:
        """The picker name of a model in the local Hugging Face cache (``hf-hub:ORG/NAME[@REVISION]``, the prefix
        optional), after opening it: a name not in the cache is refused with the folder it would be in."""
        text = (text or "").strip() if isinstance(text, str) else ""
        if not text:
            example = f"{HUB_PREFIX}timm/vit_tiny_patch16_224"
            raise AppError(f"type a Hugging Face model name: {HUB_PREFIX}ORG/NAME (e.g. {example})")
        name = text if text.startswith(HUB_PREFIX) else HUB_PREFIX + text
        self.model(name)
        return name

    def add_upload(self, files: list[str]) -> str:
        """Validate uploaded checkpoint file(s) and keep them as ``uploaded/NAME.safetensors`` or, for a zipped
        model folder, as the folder ``uploaded/NAME``.

        Accepted: one ``.safetensors`` of ours; one ``.zip`` of a model folder in timm's or transformers' layout
        (:func:`~ssog_core.checkpoint.folder_zip.unpack_model_zip`: unpacked safely, opened, then renamed into
        place); or a upstream-implementation ``.pt`` together with the ``.json`` of its ViT arguments (read with
        ``weights_only=True`` and converted; never unpickled).
        """
        paths = [Path(f) for f in files or []]
        if not paths:
            raise AppError("no file uploaded")
        by_suffix: dict[str, list[Path]] = {}
        for p in paths:
            by_suffix.setdefault(p.suffix.lower(), []).append(p)
        try:
            name = self._convert_upload(paths, by_suffix)
        except CheckpointError as e:
            raise AppError(str(e)) from None
        uploads = sorted(self._uploads(), key=lambda p: p.stat().st_mtime_ns)
        for old in uploads[:-MAX_UPLOADED_CHECKPOINTS]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        return name

    def _convert_upload(self, paths: list[Path], by_suffix: dict[str, list[Path]]) -> str:
        if list(by_suffix) == [".safetensors"] and len(paths) == 1:
            src = paths[0]
            load_checkpoint(src)  # raises CheckpointError with the reason
            dest = self._upload_target(src.stem)
            shutil.copyfile(src, dest)
            return UPLOADED + dest.name
        if list(by_suffix) == [".zip"] and len(paths) == 1:
            return UPLOADED + unpack_model_zip(paths[0], self._upload_target(paths[0].stem, "")).name
        pts = by_suffix.get(".pt", []) + by_suffix.get(".pth", [])
        configs = by_suffix.get(".json", [])
        if len(pts) == 1 and len(configs) == 1 and len(paths) == 2:
            try:
                kwargs = json.loads(configs[0].read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise AppError(f"{configs[0].name} is not valid JSON: {e}") from None
            if not isinstance(kwargs, dict):
                raise AppError(f"{configs[0].name} must hold a JSON object of the upstream ViT's arguments")
            model = convert(pts[0], kwargs)
            dest = self._upload_target(pts[0].stem)
            save_checkpoint(dest, model, {"converted_from": pts[0].name, "reference_config": kwargs})
            return UPLOADED + dest.name
        if pts and not configs:
            raise AppError(
                f"{pts[0].name} is a upstream-implementation file: upload it together with a .json file holding "
                'the ViT arguments it was built with (e.g. {"num_classes": 100, "img_size": 32, "patch_size": 2})'
            )
        raise AppError(
            "upload one .safetensors checkpoint, one .zip of a model folder (timm or transformers layout), or one .pt "
            "state dict together with its config .json "
            f"(got {', '.join(p.name for p in paths)})"
        )

    def _upload_target(self, stem: str, suffix: str = ".safetensors") -> Path:
        """A new name in the upload folder for an upload called ``stem`` (``suffix`` "" for a model folder)."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem).strip("._") or "checkpoint"
        dest = self.upload_dir / f"{safe}{suffix}"
        n = 1
        while dest.exists():
            n += 1
            dest = self.upload_dir / f"{safe}_{n}{suffix}"
        return dest

    # ------------------------------------------------------------------ images

    def bundled_images(self) -> list[str]:
        return [p.name for p in list_images(self.assets_dir)] if self.assets_dir.is_dir() else []

    def _remember(self, data: bytes, name: str) -> StoredImage:
        """Decode (safely, with the pixel cap) and keep an image under the SHA-256 of its file."""
        sha = hashlib.sha256(data).hexdigest()

        def decode() -> StoredImage:
            try:
                img = load_image(data, max_pixels=self.max_pixels)
            except ImageError as e:  # the core names in-memory data "image": name the user's file instead
                raise AppError(str(e).replace("image", name, 1)) from None
            size = img.size
            img.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE), Image.Resampling.LANCZOS)
            return StoredImage(sha, name, img, size)

        return self.cache.images.get(sha, decode)

    def open_bundled(self, name: str) -> StoredImage:
        if name not in self.bundled_images():
            raise AppError(f"{name!r} is not one of the bundled images")
        return self._remember((self.assets_dir / name).read_bytes(), name)

    def open_upload(self, path: str) -> StoredImage:
        p = Path(path)
        if not p.is_file():
            raise AppError("the upload did not arrive; try again")
        if p.stat().st_size > MAX_BYTES:
            raise AppError(f"{p.name} is over the {MAX_BYTES // 1024**2} MB limit for pictures")
        return self._remember(p.read_bytes(), p.name)

    def image(self, sha: str) -> StoredImage:
        """An image seen by this server (bundled or uploaded), by the SHA-256 of its file."""
        stored = self.cache.images.peek(sha)
        if stored is not None:
            return stored
        for name in self.bundled_images():  # after a cache eviction or a server restart
            data = (self.assets_dir / name).read_bytes()
            if hashlib.sha256(data).hexdigest() == sha:
                return self._remember(data, name)
        raise AppError("that image is no longer in memory (the server restarted?): pick or upload it again")

    def find_image(self, ref: str) -> StoredImage:
        """A bundled image by name, or a seen one by SHA-256: the only two ways the API names an image (never a
        path, so no request can make the server read a file of its choosing)."""
        if not isinstance(ref, str) or not ref:
            raise AppError("no image given: a bundled image's name or the SHA-256 returned by /upload_image")
        if ref in self.bundled_images():
            return self.open_bundled(ref)
        if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
            raise AppError(
                f"{ref[:80]!r} is neither a bundled image ({', '.join(self.bundled_images()) or 'none'}) nor the "
                "SHA-256 of an uploaded one (send files with /upload_image)"
            )
        return self.image(ref)


def resize_note(stored: StoredImage, loaded: LoadedModel) -> str:
    """A visible line when the picture is not the model's input size: "size in → size used" (and whether the
    aspect ratio changed), so a squashed picture is never a surprise. Empty when it already fits."""
    w, h = stored.original_size
    mh, mw = (int(v) for v in loaded.config.img_size)
    if (w, h) == (mw, mh):
        return ""
    squash = " (stretched: a different aspect ratio)" if abs(w / h - mw / mh) > 0.01 else ""
    return f"The picture is resized {w}×{h} → {mw}×{mh} px for {loaded.name}{squash}. "


def default_image(ctx: AppContext, ckpt: str | None = None) -> StoredImage | None:
    """A bundled image for image tabs to show before the user picks one: the first of the data set ``ckpt`` was
    trained on (bundled images are named after it: ``pointer_val0000_red.png``), else the first one."""
    names = ctx.bundled_images()
    try:
        kind = str(ctx.model(ckpt).meta.get("data", "")).split(":", 1)[0] if ckpt else ""
    except Exception:  # an unreadable checkpoint is reported where it is opened, not here
        kind = ""
    own = [n for n in names if kind and n.startswith(kind + "_")]
    for name in own + [n for n in names if n not in own]:
        try:
            return ctx.open_bundled(name)
        except AppError:
            continue
    return None


def default_twin(ctx: AppContext, ckpt: str | None, variant: str | None = None) -> str:
    """The model of ``variant`` to show beside ``ckpt`` (by default the other attention kind: ``dot`` beside an
    SSOG model, ``ssog`` beside the others; ``ssog_fixed``: the fixed-field model matched to a steered one): its
    metadata's ``twin`` (a distilled student's: its teacher, :func:`teacher_of`), else its own name with its
    variant's word swapped (``ssog_layouts`` → ``dot_layouts``, ``ssog_fixed_layouts``), else the first checkpoint
    of that variant trained on the same data. Each candidate must be of that variant; ``NO_TWIN`` when none is."""
    if not ckpt:
        return NO_TWIN
    names = ctx.checkpoint_names()
    try:
        loaded = ctx.model(ckpt)
    except Exception:
        return NO_TWIN
    want = variant or ("dot" if loaded.is_ssog else "ssog")

    def of(name: str, same_data: bool = False) -> bool:
        try:
            other = ctx.model(name)
        except Exception:  # an unreadable checkpoint is reported where it is opened, not here
            return False
        return other.variant == want and (not same_data or other.meta.get("data") == loaded.meta.get("data"))

    hinted = loaded.meta.get("twin") or teacher_of(ctx, loaded)
    swapped = ckpt.replace(loaded.variant, want, 1)
    named = [n for n in (hinted, swapped) if isinstance(n, str) and n != ckpt and n in names]
    return next((n for n in named if of(n)), None) or next((n for n in names if n != ckpt and of(n, True)), NO_TWIN)


def teacher_of(ctx: AppContext, loaded: LoadedModel) -> str | None:
    """The picker name of the teacher a distilled student's metadata names (``distill.teacher``: a picker name, or
    the path the command line was given, matched by its file or folder name), when the pickers offer it."""
    teacher = loaded.teacher
    if teacher is None:
        return None
    names = ctx.checkpoint_names()
    if teacher in names:
        return teacher
    if teacher.startswith(HUB_PREFIX):
        return teacher if ctx.offers(teacher) else None
    base = Path(teacher.rstrip("/")).name
    return base if base in names else None

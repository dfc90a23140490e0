"""The app's side of the target share on ``pointer`` (:mod:`ssog_core.interventions.target_share`): of the attention
patch queries put on the three discs, the share on the disc the cue points at, per layer.

One validation image (its scene and its shares, unedited and with every μ gate closed) is light work, done in the
serving process and kept in ``ctx.cache.effects`` per (model, image); the mean over the first N validation images
with its intervals and the paired μ-closed change is a heavy job (:func:`ssog_core.interventions.heavy.target_share`
on :func:`app.queues.engine`), kept per (model, N). A model of any other data is refused in words before anything
runs (the readout is defined on pointer scenes).
"""

from __future__ import annotations

from typing import Any

from app import queues
from app.state import AppContext, LoadedModel
from ssog_core.interventions import heavy
from ssog_core.interventions.target_share import ImageShare, image_target_share, pointer_scenes
from ssog_core.interventions.validation import eval_images

DEFAULT_IMAGES = 100  # the mean's images unless asked: a few seconds a pass on a CPU
Stop = Any  # a stop callable (or None) as app.queues.submitted takes it


def scenes(loaded: LoadedModel) -> int:
    """How many validation scenes ``loaded``'s recorded data holds; a model of other data is refused in words."""
    return len(pointer_scenes(loaded.meta, loaded.config.img_size))


def one_image(ctx: AppContext, loaded: LoadedModel, index: int) -> ImageShare:
    """Validation image ``index`` of the model's data: its scene and its share per layer (unedited and, for a
    model that steers μ, with every μ gate closed)."""
    scenes(loaded)
    key = ("target_share_image", loaded.key, int(index))
    return ctx.cache.effects.get(key, lambda: image_target_share(loaded.model, loaded.meta, int(index)))


def readout(
    ctx: AppContext, loaded: LoadedModel, n: int, stop: Stop = None, watch: queues.Watch | None = None
) -> dict[str, Any]:
    """The ``/target_share`` answer, as ``python -m ssog_core target-share --json`` writes it, on the first ``n``
    validation images, as a heavy job; ``stop`` cancels it, also while it waits for a heavy slot."""
    n = eval_images(int(n), scenes(loaded))  # refused in words here, before the job is submitted
    key = ("target_share", loaded.key, n)
    return queues.submitted(ctx.cache.effects, key, heavy.target_share, loaded.key[0], n, stop=stop, watch=watch)

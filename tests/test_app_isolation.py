"""Isolation under concurrency: users editing the one shared model at the same moment each get exactly what their
edit gives alone, and a user without edits gets the unedited model's numbers; the caches hold nothing a request
could get for a different checkpoint, image, edit list, control, α or N."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from app import interventions
from app.export_maps import control_for, maps_for
from app.state import AppContext
from ssog_core import save_checkpoint
from tests.app_fixtures import designed_ssog, write_images

pytestmark = pytest.mark.slow  # live servers and many rounds: the full suite only

SHAPES = {"data": "shapes:train=4,val=40,classes=5", "class_names": ["circle", "square", "triangle", "star", "cross"]}
CKPT = "ssog_shapes.safetensors"
USERS = {
    "ada": [{"op": "close_gate", "layer": 1, "tap": "mu"}, {"op": "ablate_head", "layer": 0, "head": 1}],
    "grace": [{"op": "scale_gate", "layer": 0, "tap": "sigma", "factor": 0.25}, {"op": "swap_axes", "layer": 1,
                                                                                  "head": 0}],
}  # fmt: skip
ROUNDS = 16
EVERY = 5  # every EVERY-th round also measures the edit on validation images (a new N each time)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("isolation")
    (root / "ckpt").mkdir()
    save_checkpoint(root / "ckpt" / CKPT, designed_ssog(depth=2), SHAPES)
    write_images(root / "assets")
    return root


def context(root, tmp_path_factory) -> AppContext:
    return AppContext(root / "ckpt", root / "assets", upload_dir=tmp_path_factory.mktemp("uploads"))


def edited(ctx: AppContext, user: str, r: int) -> dict[str, Any]:
    """What /intervene answers; N is new each time, so each validation effect is computed anew, not cached."""
    return interventions.intervene(ctx, CKPT, "scene.png", USERS[user], eval_images=0 if r % EVERY else 3 + r)


def unedited(ctx: AppContext, r: int) -> tuple[np.ndarray, np.ndarray]:
    """The unedited model's logits and export maps (α changes every round: computed anew, not read from a cache)."""
    loaded, stored = ctx.model(CKPT), ctx.find_image("scene.png")
    maps = maps_for(ctx, loaded, stored, 0.3 + 0.01 * r)
    return loaded.model(loaded.input(stored.image)).detach().numpy(), maps.accumulated


def test_two_users_editing_the_shared_model_at_once_get_what_each_gets_alone(folders, tmp_path_factory):
    alone = context(folders, tmp_path_factory)  # its own model and caches: nothing computed here is reused
    want = {(u, r): edited(alone, u, r) for u in USERS for r in range(ROUNDS)}
    want_plain = [unedited(alone, r) for r in range(ROUNDS)]
    assert want[("ada", 0)]["edited"] != want[("grace", 0)]["edited"] != want[("ada", 0)]["unedited"]

    shared = context(folders, tmp_path_factory)
    got: dict[tuple[str, int], Any] = {}
    got_plain: dict[int, Any] = {}
    failures: list[BaseException] = []
    barrier = threading.Barrier(len(USERS) + 1)

    def user(name: str | None) -> None:
        try:
            for r in range(ROUNDS):
                barrier.wait(timeout=60)  # every round starts all users at the same moment
                if name is None:
                    got_plain[r] = unedited(shared, r)
                else:
                    got[(name, r)] = edited(shared, name, r)
        except BaseException as e:  # noqa: BLE001 (reported below, with the others)
            failures.append(e)
            barrier.abort()

    threads = [threading.Thread(target=user, args=(u,)) for u in (*USERS, None)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for key, value in want.items():
        assert got[key] == value, key  # bit-identical: JSON floats compared exactly
    for r, (logits, maps) in enumerate(want_plain):
        assert np.array_equal(got_plain[r][0], logits) and np.array_equal(got_plain[r][1], maps), r
    assert unedited(shared, 0)[0].tobytes() == want_plain[0][0].tobytes()  # the model is left unedited


def test_export_map_caches_are_keyed_by_everything_the_maps_depend_on(folders, tmp_path_factory):
    shared, fresh = context(folders, tmp_path_factory), context(folders, tmp_path_factory)
    loaded, scene, gray = shared.model(CKPT), shared.find_image("scene.png"), shared.find_image("gray.png")
    maps_for(shared, loaded, scene, 0.50004)  # rounds to the same α as 0.5: must then have been computed at 0.5
    for image, alpha in [(scene, 0.5), (gray, 0.5), (scene, 0.25)]:
        got = maps_for(shared, loaded, image, alpha)
        want = maps_for(fresh, fresh.model(CKPT), fresh.find_image(image.name), alpha)
        assert got.alpha == want.alpha == alpha and np.array_equal(got.accumulated, want.accumulated)
        for control in ("blank", "validation") if alpha == 0.5 else ("blank",):  # validation maps: once per α
            c = control_for(shared, loaded, image, got, control)
            w = control_for(fresh, fresh.model(CKPT), fresh.find_image(image.name), want, control)
            assert np.array_equal(c.accumulated, w.accumulated), (image.name, alpha, control)
    raw = maps_for(shared, loaded, scene, 0.5)
    blank, validation = (control_for(shared, loaded, scene, raw, c).accumulated for c in ("blank", "validation"))
    assert not np.array_equal(blank, validation) and not np.array_equal(raw.accumulated, blank)

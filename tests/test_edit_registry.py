"""The registry of edit ops: one op per name, one meaning per field name, dot-product support declared once, the
edit list's JSON Schema generated from it (and agreeing with the parser), and the one centre query of a grid."""

from __future__ import annotations

import random
from dataclasses import dataclass

import jsonschema
import pytest
import torch

from ssog_core.analysis.head_spec import spec_from_head
from ssog_core.analysis.measures import layer_fields
from ssog_core.field import centre_query
from ssog_core.interventions import ops
from ssog_core.interventions.edit import (
    EDITS,
    Edit,
    EditError,
    check_edits,
    dot_product_ops,
    edits_schema,
    param,
    parse_edits,
)
from ssog_core.nn.vit import ViT


@pytest.fixture
def registry():
    """The registry as it was, checked unchanged after the test (and restored, so one failure stays one)."""
    before = dict(EDITS)
    yield before
    changed = dict(EDITS) != before or list(EDITS) != list(before)
    EDITS.clear()
    EDITS.update(before)
    assert not changed, "the registry changed"


def test_a_second_op_with_a_taken_name_is_refused(registry):
    with pytest.raises(
        TypeError,
        match=r"op 'close_gate' is taken by ssog_core.interventions.ops.CloseGate: give Again another name",
    ):

        @dataclass(frozen=True)
        class Again(Edit):
            """A second close_gate."""

            op = "close_gate"
            head: int = param(0, kind="int", low=0, required=True, help="the head")

    assert EDITS["close_gate"] is ops.CloseGate


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("tap", dict(kind="choice", choices=("mu", "sigma"), help="two taps only")),  # other choices
        ("mode", dict(kind="text", help="a mode in words")),  # another kind
        ("factor", dict(kind="float", low=0.0, high=2.0, help="another range")),  # another range
        ("atom", dict(kind="int", low=1, required=True, help="from 1")),  # another lowest value
    ],
)
def test_a_field_name_declared_with_another_meaning_is_refused(registry, name, spec):
    with pytest.raises(TypeError, match=rf"field '{name}' of op 'test_bad' .* means something else in op '\w+'"):
        Bad = type("Bad", (Edit,), {"__annotations__": {name: "object"}, "op": "test_bad", name: param(None, **spec)})
        dataclass(frozen=True)(Bad)
    assert "test_bad" not in EDITS


def test_a_field_name_may_differ_in_help_and_in_whether_the_op_needs_it(registry):
    @dataclass(frozen=True)
    class Nudge(Edit):
        """A test op: its head is optional here, needed in ablate_head."""

        op = "test_nudge"
        head: int | None = param(None, kind="int", low=0, optional=True, help="a head, or every head")

    assert EDITS.pop("test_nudge") is Nudge
    assert Nudge.params()["head"].meaning() == ops.AblateHead.params()["head"].meaning()


def test_dot_product_support_is_declared_once_and_read_both_ways():
    assert dot_product_ops() == ["ablate_head", "patch_head", "replace_with_field"]
    assert ops.AblateHead(0, 1).works_on_dot_product()
    assert ops.PatchHead(0, 1, "x", "output").works_on_dot_product()
    assert not ops.PatchHead(0, 1, "x", "steering").works_on_dot_product()
    assert not ops.SwapAxes(0, 1).works_on_dot_product() and not ops.CloseGate(0).works_on_dot_product()
    words = [cls.dot_product_words() for cls in EDITS.values()]
    assert [w for w in words if w] == ["ablate_head", "patch_head with what='output'", "replace_with_field"]
    dot = ViT(num_classes=3, img_size=16, patch_size=4, dim=16, depth=1, num_heads=2, attn="dot")
    said = r"only ablate_head and patch_head with what='output' and replace_with_field work on it"
    with pytest.raises(EditError, match=said):
        check_edits(dot, [ops.PatchHead(0, 1, "img", "steering")], {"img": None})
    check_edits(dot, [ops.PatchHead(0, 1, "img", "output"), ops.AblateHead(0, 0)], {"img": None})


def by_op(schema: dict) -> dict[str, dict]:
    """Each op's part of the edits schema (``if`` op ``then`` part)."""
    return {s["if"]["properties"]["op"]["const"]: s["then"] for s in schema["items"]["allOf"]}


def test_the_edits_schema_names_every_op_with_its_fields_choices_and_needs():
    schema = edits_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    items, ops_ = schema["items"]["properties"], by_op(schema)
    assert items["op"]["enum"] == list(ops_) == list(EDITS)
    for op, cls in EDITS.items():
        assert set(ops_[op]["properties"]) == set(cls.params()) <= set(items), op
        assert ops_[op]["required"] == [n for n, p in cls.params().items() if p.required]
    gate = ops_["close_gate"]["properties"]
    assert gate["tap"] == {"enum": ["mu", "sigma", "lambda", "all"], "default": "all",
                           "description": "the steering tap whose gate it acts on"}  # fmt: skip
    assert gate["head"]["oneOf"] == [{"type": "null"}, {"type": "integer", "minimum": 0}]
    needed = {"type": "integer", "minimum": 0, "description": "the head, from 0"}
    assert ops_["ablate_head"]["properties"]["head"] == needed
    assert items["head"]["oneOf"][0] == {"type": "null"}  # any op: one of them may leave it out
    said = "close_gate, scale_gate, replace_with_field: one head; left out: every head | "
    assert items["head"]["description"].startswith(said)
    factor = ops_["scale_gate"]["properties"]["factor"]
    assert (factor["type"], factor["minimum"], factor["maximum"], factor["default"]) == ("number", 0, 10, 1)
    assert items["what"]["enum"] == ["output", "steering"]
    assert ops_["move_atom"]["required"] == ["layer", "head", "atom"]
    atoms = ops_["replace_with_field"]["properties"]["atoms"]
    assert (atoms["type"], atoms["minimum"], atoms["maximum"], atoms["default"]) == ("integer", 1, 8, 4)
    assert ops_["replace_with_field"]["properties"]["replacement"]["enum"] == ["fit", "field"]


def test_a_validator_says_which_field_is_wrong():
    validator = jsonschema.Draft202012Validator(edits_schema())
    for edit, said in [
        ({"op": "rotate", "layer": 0}, "'rotate' is not one of ['close_gate'"),
        ({"op": "close_gate", "layer": 0, "tap": "beta"}, "'beta' is not one of ['mu', 'sigma', 'lambda', 'all']"),
        ({"op": "drop_atom", "layer": 0, "head": 1}, "'atom' is a required property"),
        ({"op": "ablate_head", "layer": 0, "head": None}, "None is not of type 'integer'"),
    ]:
        assert jsonschema.exceptions.best_match(validator.iter_errors([edit])).message.startswith(said), edit


def _random_edit(rng: random.Random) -> dict:
    """An edit as a client might write it: mostly right, sometimes a wrong value, a missing or an unknown field."""
    op = rng.choice([*EDITS, "rotate"])
    good = {
        "layer": rng.randint(0, 3), "head": rng.choice([0, 2, None]), "tap": rng.choice(["mu", "all"]),
        "factor": rng.uniform(0, 3), "mode": "zero", "source": "img", "what": "steering", "atom": 1,
        "dy": rng.uniform(-2, 2), "dx": 0.5, "steered": False, "replacement": rng.choice(["fit", "field"]),
        "atoms": rng.randint(1, 4),
        "head_spec": {"grid": [5, 7], "query": [2, 3], "tau": 1.0, "atoms": [dict(y=1, x=2, sy=1, sx=1, w=1)]},
    }  # fmt: skip
    bad = {"layer": -1, "head": "two", "tap": "beta", "factor": 11.5, "mode": "mean", "what": 3, "atom": 1.5,
           "dy": "up", "source": 7, "replacement": "mean", "atoms": rng.choice([0, 5])}  # fmt: skip
    names = list(EDITS[op].params()) if op in EDITS else ["layer"]
    edit = {"op": op, **{n: good[n] for n in names if n in good and rng.random() < 0.8}}
    if op == "set_head" or rng.random() < 0.7:
        return edit  # set_head: its head_spec is checked beyond the schema (ranges of a playground head)
    trouble = rng.choice([*(n for n in names if n in bad), "extra"])
    if trouble == "extra":
        edit["speed"] = 1
        return edit
    return {**edit, trouble: bad[trouble]}


def test_the_schema_accepts_exactly_what_the_parser_accepts():
    """Random edits, right and wrong: the schema (what a client is told) and the parser (what the server takes)
    agree on each. Unknown fields: the schema lists every field, and the parser refuses any other."""
    validator = jsonschema.Draft202012Validator(edits_schema())
    rng = random.Random(35)
    verdicts = set()
    for _ in range(400):
        edit = _random_edit(rng)
        try:
            parse_edits([edit])
            parsed = True
        except EditError:
            parsed = False
        listed = edit["op"] in EDITS and set(edit) - {"op"} <= set(EDITS[edit["op"]].params())
        valid = validator.is_valid([edit]) and listed
        assert valid == parsed, edit
        verdicts.add(parsed)
    assert verdicts == {True, False}


@pytest.mark.parametrize(
    ("grid", "centre"),
    [((1, 1), (0, 0)), ((2, 2), (0, 0)), ((7, 5), (3, 2)), ((8, 6), (3, 2)), ((20, 20), (9, 9)), ((5, 8), (2, 3))],
)
def test_the_centre_query_is_the_middle_cell_or_the_upper_left_of_the_middle_four(grid, centre):
    def middle(n: int) -> int:  # nearest cell to the axis' middle (n − 1)/2; of two, the lower index
        return min(range(n), key=lambda c: (abs(c - (n - 1) / 2), c))

    assert centre_query(grid) == (middle(grid[0]), middle(grid[1])) == centre


def test_a_trained_head_opened_as_a_spec_has_its_star_on_the_centre_query():
    torch.manual_seed(0)
    model = ViT(num_classes=3, img_size=(32, 24), patch_size=4, dim=16, depth=1, num_heads=2, num_atoms=2)
    lf = layer_fields(model)[0]
    for grid in ((8, 6), (7, 5)):
        assert spec_from_head(lf, 1, grid=grid).query == centre_query(grid)

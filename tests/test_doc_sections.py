"""Marked sections of a document (``ssog_core.checkpoint.files``): a script replaces its own section and nothing else,
atomically; broken markers are refused; every script's section sits once in docs/RESULTS.md."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ssog_core.checkpoint.files import replace_section, section_markers

ROOT = Path(__file__).resolve().parents[1]
MARKS = section_markers("demo")
BLOCK = f"{MARKS[0]}\n## Demo\n\nnew numbers: 2\n{MARKS[1]}"
# text around the section as people write it: no final newline, CRLF and trailing spaces, another marked section
AROUND = ("# Doc\r\n\r\nabove  \n\n", "\n\n<!-- other:begin -->\nother\n<!-- other:end -->\nbelow, last line")


def test_the_section_is_replaced_and_every_other_byte_kept(tmp_path):
    doc = tmp_path / "RESULTS.md"
    doc.write_bytes(f"{AROUND[0]}{MARKS[0]}\nold numbers: 1\nmore\n{MARKS[1]}{AROUND[1]}".encode())
    replace_section(doc, MARKS, BLOCK)
    assert doc.read_bytes() == f"{AROUND[0]}{BLOCK}{AROUND[1]}".encode()
    replace_section(doc, MARKS, BLOCK)  # writing it again changes nothing
    assert doc.read_bytes() == f"{AROUND[0]}{BLOCK}{AROUND[1]}".encode()


@pytest.mark.parametrize(
    ("before", "anchor", "after"),
    [
        (None, None, "BLOCK\n"),
        ("", None, "BLOCK\n"),
        ("# Doc\n\nbody\n\n\n", None, "# Doc\n\nbody\n\nBLOCK\n"),
        ("# Doc\n\nbody", "<!-- next:begin -->", "# Doc\n\nbody\n\nBLOCK\n"),  # the anchor is not there: the end
        ("# Doc\n\n<!-- next:begin -->\nx\n", "<!-- next:begin -->", "# Doc\n\nBLOCK\n\n<!-- next:begin -->\nx\n"),
    ],
    ids=["new-file", "empty", "appended", "anchor-missing", "before-anchor"],
)
def test_a_document_without_the_section_gets_it(tmp_path, before, anchor, after):
    doc = tmp_path / "docs" / "RESULTS.md"
    if before is not None:
        doc.parent.mkdir()
        doc.write_text(before)
    replace_section(doc, MARKS, BLOCK, before=anchor)
    assert doc.read_text() == after.replace("BLOCK", BLOCK)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (f"a\n{MARKS[0]}\nhalf a section\n", "1× and <!-- demo:end --> 0×"),
        (f"a\nhalf a section\n{MARKS[1]}\n", "0× and <!-- demo:end --> 1×"),
        (f"{MARKS[1]}\nx\n{MARKS[0]}\n", "the end first"),
        (f"{MARKS[0]}\n1\n{MARKS[1]}\n{MARKS[0]}\n2\n{MARKS[1]}\n", "2× and <!-- demo:end --> 2×"),
    ],
    ids=["begin-only", "end-only", "reversed", "twice"],
)
def test_broken_markers_are_refused_and_the_document_left_alone(tmp_path, text, says):
    doc = tmp_path / "RESULTS.md"
    doc.write_text(text)
    with pytest.raises(ValueError, match="put each marker there once") as e:
        replace_section(doc, MARKS, BLOCK)
    assert says in str(e.value)
    assert doc.read_text() == text


def test_a_block_without_its_markers_is_refused(tmp_path):
    doc = tmp_path / "RESULTS.md"
    for block in ("## Demo\n", f"{MARKS[0]}\n## Demo\n", f"## Demo\n{MARKS[1]}", f"{MARKS[0]}\nx\n{MARKS[1]}\n"):
        with pytest.raises(ValueError, match="must start with <!-- demo:begin --> and end with <!-- demo:end -->"):
            replace_section(doc, MARKS, block)
    assert not doc.exists()


def test_a_failure_during_the_write_leaves_the_old_document(tmp_path, monkeypatch):
    doc = tmp_path / "RESULTS.md"
    old = f"# Doc\n\n{MARKS[0]}\nold\n{MARKS[1]}\n"
    doc.write_text(old)
    real = Path.write_text

    def half_then_full_disk(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half_then_full_disk)
    with pytest.raises(OSError, match="No space left"):
        replace_section(doc, MARKS, BLOCK)
    monkeypatch.undo()
    assert doc.read_text() == old
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary file left behind


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"doc_sections_{name}", ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_script_owns_one_section_of_results_md_and_the_prose_between_is_nobodys():
    """Each script's markers sit once in docs/RESULTS.md, begin before end, the sections in the document's order and
    apart, so every script rewrites only its own section (the first, ``layouts-pair``, included: its script used to
    rewrite the whole document and drop what lay outside the sections it knew)."""
    owners = {
        "results": "MARKS",
        "export_control": "MARKERS",
        "small_data": None,
        "interventions_report": "MARKS",
        "matched_trio": "MARKS",
        "ablation": "MARKS",
        "distill": "MARKS",
    }
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    spans = []
    for name, attr in owners.items():
        module = _script(name)
        begin, end = (module.MARK_BEGIN, module.MARK_END) if attr is None else getattr(module, attr)
        assert (begin, end) == section_markers(begin.split()[1].rsplit(":", 1)[0])
        assert text.count(begin) == text.count(end) == 1, name
        spans.append((text.index(begin), text.index(end)))
    assert all(b < e for b, e in spans)
    assert spans == sorted(spans) and all(e < b for (_, e), (b, _) in zip(spans, spans[1:], strict=False))
    assert text.startswith(section_markers("layouts-pair")[0] + "\n# Results")
    trio, ablation = spans[list(owners).index("matched_trio")], spans[list(owners).index("ablation")]
    assert "## Where steering pays" in text[trio[1] : ablation[0]]  # prose between sections, by hand

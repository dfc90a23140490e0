"""ssog_core/runtime: the folder fingerprint, a folder packed into one zip and unpacked again (names checked, bytes
capped), and the LRU keeping any value, None too."""

from __future__ import annotations

import io
import os
import stat
import zipfile
from pathlib import Path

import pytest

from ssog_core.runtime.folders import FolderError, OverCap, checked_members, fingerprint, pack, unpack
from ssog_core.runtime.lru import LRU


def a_folder(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def archive(members: dict[str, bytes], link: str | None = None) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        if link is not None:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            z.writestr(info, "/etc/passwd")
    return buf.getvalue()


def test_a_folder_fingerprint_changes_with_any_file_and_a_file_stands_for_itself(tmp_path):
    folder = a_folder(tmp_path / "m", {"config.json": b"{}", "model.safetensors": b"w" * 50})
    (folder / "sub").mkdir()  # sub-folders are no part of a model folder
    first = fingerprint(folder)
    assert first[0] == str(folder) and first[2] == 52
    os.utime(folder / "config.json", ns=(first[1] + 10**9, first[1] + 10**9))
    assert fingerprint(folder)[1] == first[1] + 10**9  # a newer file: a newer fingerprint
    (folder / "extra.json").write_bytes(b"[1]")
    assert fingerprint(folder)[2] == 55
    st = (folder / "config.json").stat()
    assert fingerprint(folder / "config.json") == (str(folder / "config.json"), st.st_mtime_ns, 2)
    assert fingerprint(a_folder(tmp_path / "empty", {}))[1:] == (0, 0)


def test_equal_folders_pack_alike_and_unpack_to_the_same_files(tmp_path):
    files = {"b.json": b'{"x": 1}', "a.bin": bytes(range(256)) * 3}
    one, two = a_folder(tmp_path / "one", files), a_folder(tmp_path / "two", files)
    os.utime(two / "a.bin", ns=(10**18, 10**18))  # dates differ; the packs do not
    assert pack(one) == pack(two)
    assert pack(one / "a.bin") == files["a.bin"]  # a file packs as its own bytes
    (tmp_path / "out").mkdir()
    out = unpack(pack(one), tmp_path / "out", cap=len(pack(one)))  # stored: never more than the archive
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    with pytest.raises(FolderError, match="empty is an empty folder"):
        pack(a_folder(tmp_path / "empty", {}))


@pytest.mark.parametrize(
    ("members", "link", "says"),
    [
        ({"../escaped.json": b"{}"}, None, "'../escaped.json' points outside the archive"),
        ({"/tmp/abs.json": b"{}"}, None, "'/tmp/abs.json' points outside the archive"),
        ({"C:/x.json": b"{}"}, None, "'C:/x.json' points outside the archive"),
        ({"ok.json": b"{}"}, "config.json", "'config.json' is a link"),
        ({"sub/inner.json": b"{}"}, None, "'sub/inner.json' is not a file of one folder"),
    ],
)
def test_unpacking_refuses_names_that_are_not_files_of_one_folder(tmp_path, members, link, says):
    data = archive(members, link)
    with pytest.raises(FolderError, match=says):
        unpack(data, tmp_path, cap=10**6)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_unpacking_counts_the_bytes_it_writes_against_the_cap(tmp_path):
    data = archive({"a.bin": b"a" * 600, "b.bin": b"b" * 600})
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert [i.filename for i in checked_members(z)] == ["a.bin", "b.bin"]
    with pytest.raises(OverCap, match="more than the 1,000 bytes allowed"):
        unpack(data, tmp_path, cap=1000)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) <= 1000  # cut off mid-write, never past the cap


def test_the_lru_keeps_none_and_makes_a_value_once():
    cache: LRU[int | None] = LRU(2)
    made = []
    for key in ["none", "none", "one", "none"]:
        cache.get(key, lambda k=key: made.append(k) or (None if k == "none" else 1))
    assert made == ["none", "one"] and "none" in cache and len(cache) == 2
    cache.put("two", 2)  # "none" was used last: "one" goes
    assert "one" not in cache and cache.peek("none") is None and cache.peek("two") == 2

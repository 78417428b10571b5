"""bench/gpu_wheels.py packs wheels into folders of a bounded size (the large ones split into parts with their sha256)
and joins them back, refusing a missing or damaged part."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def gw(load_bench: Callable[[str], ModuleType]) -> ModuleType:
    return load_bench("gpu_wheels")


def _packed(gw: ModuleType, tmp_path: Path) -> tuple[dict[str, bytes], list[Path]]:
    """A folder with one file over the limit (1000 bytes) and three under it, packed; the files and the loads."""
    files = {"big-1.0-py3-none-any.whl": os.urandom(2500), "a.whl": b"a" * 600, "b.whl": b"b" * 300, "c.whl": b"c" * 50}
    src = tmp_path / "src"
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    return files, gw.pack(src, 1000)


def _gather(loads: list[Path], dst: Path) -> Path:
    """What the machine does: the files of every load copied into one folder."""
    dst.mkdir()
    for load in loads:
        for path in load.iterdir():
            shutil.copy(path, dst / path.name)
    return dst


def test_pack_bounds_every_load_and_join_restores_the_files(gw: ModuleType, tmp_path: Path) -> None:
    files, loads = _packed(gw, tmp_path)
    for load in loads:
        assert sum(p.stat().st_size for p in load.iterdir()) <= 1000
    names = sorted(p.name for load in loads for p in load.iterdir())
    parts = [f"big-1.0-py3-none-any.whl.part-{i}-of-3" for i in (1, 2, 3)]
    assert names == sorted(["a.whl", "b.whl", "c.whl", "big-1.0-py3-none-any.whl.sha256", *parts])
    assert len(loads) == 4  # 1000, 1000 (parts), 600 + 300 + 50, 500 (the last part) + 91 (the sha256)
    dst = _gather(loads, tmp_path / "dst")
    assert gw.join_parts(dst) == [dst / "big-1.0-py3-none-any.whl"]
    assert {p.name: p.read_bytes() for p in dst.glob("*.whl")} == files
    assert not list(dst.glob("*.part-*"))  # the parts are gone
    assert gw.join_parts(dst) == []  # joined already: nothing to do
    for path in loads[-1].iterdir():  # the last folder copied in again: its part comes back beside the wheel
        shutil.copy(path, dst / path.name)
    assert list(dst.glob("*.part-*"))
    assert gw.join_parts(dst) == [] and not list(dst.glob("*.part-*"))
    assert {p.name: p.read_bytes() for p in dst.glob("*.whl")} == files


def test_join_refuses_a_missing_part(gw: ModuleType, tmp_path: Path) -> None:
    _, loads = _packed(gw, tmp_path)
    dst = _gather(loads, tmp_path / "dst")
    (dst / "big-1.0-py3-none-any.whl.part-3-of-3").unlink()
    with pytest.raises(ValueError, match=r"parts \[3\] of 3 are missing"):
        gw.join_parts(dst)
    assert not (dst / "big-1.0-py3-none-any.whl").exists()


def test_join_refuses_a_damaged_part(gw: ModuleType, tmp_path: Path) -> None:
    _, loads = _packed(gw, tmp_path)
    dst = _gather(loads, tmp_path / "dst")
    part = dst / "big-1.0-py3-none-any.whl.part-2-of-3"
    part.write_bytes(bytes(b ^ 1 for b in part.read_bytes()))
    with pytest.raises(ValueError, match="is not the recorded"):
        gw.join_parts(dst)
    assert not list(dst.glob("*.whl.joining")) and not (dst / "big-1.0-py3-none-any.whl").exists()
    assert part.exists()  # kept for a second try


def test_manifest_is_sha256sum_format(gw: ModuleType, tmp_path: Path) -> None:
    """``sha256sum -c`` checks the joined file by hand too."""
    (tmp_path / "x.whl").write_bytes(b"x" * 10)
    digest = gw.sha256(tmp_path / "x.whl")
    gw.split_file(tmp_path / "x.whl", 4)
    assert (tmp_path / "x.whl.sha256").read_text() == f"{digest}  x.whl\n"
    assert sorted(p.name for p in tmp_path.glob("x.whl.part-*")) == [f"x.whl.part-{i}-of-3" for i in (1, 2, 3)]


def test_unmet_requirements_names_what_is_missing(gw: ModuleType) -> None:
    assert gw.unmet_requirements("pytest") == []
    assert gw.unmet_requirements("no-such-distribution") == ["no-such-distribution (not installed)"]

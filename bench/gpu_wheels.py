"""Wheels for a bare GPU machine that takes a limited size per copy: pack them here, join and install them there.

Ray's wheel (~79 MB) is larger than what one copy to the machine may hold next to the repository (64 MiB in all, the
repository ~20 MiB of it). ``pack`` (run by ``make gpu-wheels-ray``) splits every file over ``--mib`` into numbered
parts ``NAME.part-1-of-3`` ... with ``NAME.sha256`` (the whole file's digest, in ``sha256sum`` format) and spreads
all files over numbered folders ``1/``, ``2/``, ... of at most ``--mib`` each: one folder per copy. There, the
folders' files are gathered in one folder; ``join_parts`` rebuilds each split file, checks its digest and removes its
parts, and ``install`` puts every wheel into a private folder that ``bench/gpu_check.py --wheels`` runs with.

    python bench/gpu_wheels.py pack .whl-ray --mib 32
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

MIB = 1 << 20
CHUNK = 4 * MIB
PART = re.compile(r"^(?P<name>.+)\.part-(?P<index>\d+)-of-(?P<count>\d+)$")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split_file(path: Path, part_bytes: int) -> list[Path]:
    """Replace ``path`` by its parts (at most ``part_bytes`` each) and ``NAME.sha256``; returns the parts."""
    size = path.stat().st_size
    count = -(-size // part_bytes)
    parts = [path.with_name(f"{path.name}.part-{i}-of-{count}") for i in range(1, count + 1)]
    with path.open("rb") as src:
        for part in parts:
            with part.open("wb") as dst:
                left = part_bytes
                while left and (chunk := src.read(min(CHUNK, left))):
                    dst.write(chunk)
                    left -= len(chunk)
    path.with_name(f"{path.name}.sha256").write_text(f"{sha256(path)}  {path.name}\n")
    path.unlink()
    return parts


def pack(folder: Path, max_bytes: int) -> list[Path]:
    """Split the files of ``folder`` larger than ``max_bytes``, then move every file into numbered subfolders of at
    most ``max_bytes`` each (largest first, each into the first folder with room); returns the subfolders."""
    files: list[Path] = []
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        files += split_file(path, max_bytes) if path.stat().st_size > max_bytes else [path]
    files += sorted(folder.glob("*.sha256"))
    loads: list[list[Path]] = []
    sizes: list[int] = []
    for path in sorted(dict.fromkeys(files), key=lambda p: (-p.stat().st_size, p.name)):
        size = path.stat().st_size
        k = next((k for k, used in enumerate(sizes) if used + size <= max_bytes), len(loads))
        if k == len(loads):
            loads.append([])
            sizes.append(0)
        loads[k].append(path)
        sizes[k] += size
    out = []
    for k, load in enumerate(loads, start=1):
        (folder / str(k)).mkdir()
        out.append(folder / str(k))
        for path in load:
            path.rename(folder / str(k) / path.name)
    return out


def join_parts(folder: Path) -> list[Path]:
    """Rebuild every split file of ``folder`` from its parts, check it against its ``.sha256`` and remove the parts;
    returns the rebuilt files. A whole file already there with the right digest is kept as it is, and parts of it
    copied in again are removed.

    Raises:
        ValueError: a part is missing, or the joined file's digest is not the recorded one.
    """
    joined = []
    for manifest in sorted(folder.glob("*.sha256")):
        expected, name = manifest.read_text().split()
        target = folder / name
        matches = [m for p in folder.glob(f"{name}.part-*") if (m := PART.match(p.name))]
        if target.is_file() and sha256(target) == expected:
            for m in matches:
                (folder / m.group(0)).unlink()
            continue
        count = int(matches[0]["count"]) if matches else 0
        have = {int(m["index"]): folder / m.group(0) for m in matches}
        missing = [i for i in range(1, count + 1) if i not in have]
        if not matches or missing:
            raise ValueError(f"{name}: parts {missing or 'all'} of {count or '?'} are missing in {folder}")
        tmp = target.with_name(f"{name}.joining")
        with tmp.open("wb") as dst:
            for i in range(1, count + 1):
                with have[i].open("rb") as src:
                    shutil.copyfileobj(src, dst, CHUNK)
        if (got := sha256(tmp)) != expected:
            tmp.unlink()
            raise ValueError(f"{name}: joined sha256 {got} is not the recorded {expected} (a damaged part?)")
        tmp.rename(target)
        for part in have.values():
            part.unlink()
        joined.append(target)
    return joined


def install(folders: Iterable[Path], site: Path) -> int:
    """Join the split wheels of ``folders``, then install every wheel there into ``site`` (no index, no dependency
    resolution: the folders hold what the machine lacks); returns how many wheels were installed."""
    wheels: list[Path] = []
    for folder in folders:
        join_parts(folder)
        wheels += sorted(folder.glob("*.whl"))
    if not wheels:
        return 0
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    subprocess.run([*cmd, "--upgrade", "--target", str(site), *map(str, wheels)], check=True)
    return len(wheels)


def unmet_requirements(dist: str) -> list[str]:
    """``dist``'s requirements (its extras left out) that the running interpreter does not satisfy."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    try:
        lines = requires(dist) or []
    except PackageNotFoundError:
        return [f"{dist} (not installed)"]
    unmet = []
    for line in lines:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            if not req.specifier.contains(version(req.name), prereleases=True):
                unmet.append(f"{line} (have {version(req.name)})")
        except PackageNotFoundError:
            unmet.append(f"{line} (not installed)")
    return unmet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="split files over --mib and spread all over numbered folders of --mib")
    p.add_argument("folder", type=Path)
    p.add_argument("--mib", type=float, default=32.0)
    j = sub.add_parser("join", help="rebuild the split files of a folder and check their sha256")
    j.add_argument("folder", type=Path)
    args = ap.parse_args()
    if args.command == "pack":
        for load in pack(args.folder, int(args.mib * MIB)):
            size = sum(p.stat().st_size for p in load.iterdir())
            print(f"{load}: {size / MIB:.1f} MiB, {len(list(load.iterdir()))} files")
    else:
        for path in join_parts(args.folder):
            print(f"joined {path}")


if __name__ == "__main__":
    main()

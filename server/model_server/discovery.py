"""Model versions on disk: where they are, which are wanted, and when one has changed.

Layout: `DIR/<version>/model.onnx` (or `model.pt` / `model.pt2`); a bare model
file, or a directory holding the model file directly, is version `1`.
`latest` is the highest version (numeric versions compare as numbers). Hidden
entries (temp copies) are ignored. Pure reads of the file system, no state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .backends import MODEL_FILES
from .backends.torch import SIGNATURE_FILE
from .settings import MODEL_SUFFIXES

Fingerprint = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True, slots=True)
class VersionSource:
    """A version on disk: its model file and a fingerprint of its files, so a
    rewritten version is noticed and a half-copied one retried."""

    version: str
    path: Path
    fingerprint: Fingerprint


def version_key(version: str) -> tuple[int, int, str]:
    """Numbers sort numerically and above nothing; other names sort after numbers."""
    return (0, int(version), "") if version.isdigit() else (1, 0, version)


def latest_version(versions: Iterable[str]) -> str:
    return max(versions, key=version_key)


def find_model_file(directory: Path, fmt: str) -> Path | None:
    """`model.<ext>` for the format, else the directory's only model-looking file."""
    names = MODEL_FILES.get(fmt) or tuple(n for names in MODEL_FILES.values() for n in names)
    for name in names:
        candidate = directory / name
        if candidate.is_file():
            return candidate
    try:
        found = [
            p for p in directory.iterdir() if p.is_file() and p.suffix in MODEL_SUFFIXES and not p.name.startswith(".")
        ]
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def fingerprint(paths: list[Path]) -> Fingerprint:
    result = []
    for path in sorted(paths):
        try:
            stat = path.stat()
        except OSError:
            continue
        result.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(result)


def _version_files(directory: Path) -> list[Path]:
    try:
        return [p for p in directory.iterdir() if p.is_file() and not p.name.startswith(".")]
    except OSError:
        return []


def discover(root: Path, fmt: str, flat_version: str = "1") -> dict[str, VersionSource]:
    """Versions found under `root` (a file, a version-per-subdirectory directory,
    or a directory holding one model, which is `flat_version`). Hidden entries
    (temp copies) are ignored."""
    if root.is_file():
        files = [root]
        signature = root.parent / SIGNATURE_FILE
        if signature.is_file():
            files.append(signature)
        return {flat_version: VersionSource(flat_version, root, fingerprint(files))}
    if not root.is_dir():
        return {}
    versions: dict[str, VersionSource] = {}
    try:
        children = sorted(root.iterdir())
    except OSError:
        return {}
    for child in children:
        if child.name.startswith(".") or not child.is_dir():
            continue
        model_file = find_model_file(child, fmt)
        if model_file is not None:
            versions[child.name] = VersionSource(child.name, model_file, fingerprint(_version_files(child)))
    if not versions:
        model_file = find_model_file(root, fmt)
        if model_file is not None:
            versions[flat_version] = VersionSource(flat_version, model_file, fingerprint(_version_files(root)))
    return versions


def select_versions(available: Mapping[str, VersionSource], max_versions: int) -> dict[str, VersionSource]:
    """The `max_versions` highest versions (all when 0)."""
    ordered = sorted(available, key=version_key, reverse=True)
    if max_versions:
        ordered = ordered[:max_versions]
    return {v: available[v] for v in ordered}

"""``kdplug cache list|clear``: the fine-tuned teachers, teacher outputs, heads and transfer sets
kdplug stores for reuse, what its plugins store (the folders a component declares in ``stores``),
and what killed runs left behind."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ..engine.stores import SECTIONS, sections
from ..errors import UsageError
from ..plugins import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "cache",
        help="show or free the fine-tuned teachers, teacher outputs and heads kdplug stores",
        description="kdplug stores what it can reuse under the cache directory ($KDPLUG_CACHE or ~/.cache/kdplug), "
        "each entry keyed by a fingerprint of what produced it: fine-tuned teachers, teacher outputs, "
        "teacher heads, transfer sets, and what plugins store there (trained assistants, tokenizers).",
    )
    parser.add_argument("--cache-dir", dest="cache_dir", help="default: $KDPLUG_CACHE or ~/.cache/kdplug")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list",
        help="every entry with its size and what it is",
        description="Every stored entry by kind, with its size and what produced it "
        "(fine-tuned teachers: source, task, date, dev score), plus staging "
        "folders left by killed runs and damaged copies set aside.",
    )
    listing.add_argument("--cache-dir", dest="cache_dir", default=argparse.SUPPRESS)
    clear = actions.add_parser(
        "clear",
        help="delete entries: all, one kind, one key, or only what killed runs left",
        description="Delete stored entries. With no option: every entry of every kind. --kind limits to one kind, "
        "--key to the entries whose key starts with KEY (at least 4 characters, as 'kdplug cache list' shows it), "
        "--stale to "
        "what killed runs left behind (staging folders no running kdplug is writing, and damaged "
        "copies set aside). Only kdplug's own folders are touched; a later run rebuilds what it needs.",
        epilog="examples:\n  kdplug cache clear --stale\n  kdplug cache clear --kind teacher-cache\n"
        "  kdplug cache clear --key 3f9a2c",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clear.add_argument("--cache-dir", dest="cache_dir", default=argparse.SUPPRESS)
    clear.add_argument("--kind", help="only entries of this kind (a folder 'kdplug cache list' names)")
    clear.add_argument(
        "--key", help="only the entry (or entries) whose key starts with KEY (at least 4 characters, or a whole key)"
    )
    clear.add_argument("--stale", action="store_true", help="only staging folders of killed runs and damaged copies")
    parser.set_defaults(handler=handle)


@dataclass
class Item:
    kind: str
    key: str
    paths: list[Path]
    size: int
    info: str = ""
    stale: bool = False


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _teacher_info(directory: Path) -> str:
    from ..engine.teacher import FINETUNED_MARKER

    try:
        marker = json.loads((directory / FINETUNED_MARKER).read_text())
    except (OSError, ValueError):
        return ""
    parts = [f"teacher {marker.get('pretrained') or marker.get('source', '?')}", f"task {marker.get('task', '?')}"]
    if marker.get("created"):
        parts.append(f"stored {marker['created']}")
    dev = marker.get("dev") or {}
    for split, values in list(dev.items())[:1]:
        parts.append(f"{split} " + ", ".join(f"{k} {v * 100:.2f}" for k, v in values.items()))
    return "; ".join(parts)


def _cache_info(directory: Path) -> str:
    """What a teacher-outputs entry holds, in bytes: a split's logits, or its layer vectors and the
    logits entry they pair with; an entry of an older format is marked as no longer read."""
    from ..engine.cache import FORMAT_VERSION, LAYERS, read_meta

    meta = read_meta(directory)
    if meta is None:
        return "incomplete"
    details = ", ".join(f"{key} {value}" for key, value in meta.description.items())
    if meta.version != FORMAT_VERSION:
        return (
            f"{meta.num_examples} examples; {details}; format {meta.version}, no longer read "
            f"('kdplug cache clear --key {directory.name[:8]}' frees it)"
        )
    if meta.kind == LAYERS:
        what = f"layer vectors of {len(meta.layers)} layers, {meta.data_bytes:,} bytes; pairs with logits {meta.logits}"
    else:
        what = f"logits, {meta.data_bytes:,} bytes"
    return f"{meta.num_examples} examples; {what}; {details}"


#: what ``kdplug cache`` says of a file or folder under one of its kinds that kdplug did not write
NOT_OURS = "left alone: not written by kdplug"


#: the key of an entry of the engine's own kinds: a fingerprint (kdplug/fingerprint.py), in hexadecimal
KEY = re.compile(r"[0-9a-f]{16,64}")


def written_by_kdplug(kind: str, paths: list[Path]) -> bool:
    """Whether the files of one key are an entry kdplug wrote, by its own records: in the engine's kinds
    a fingerprint for a name, and a folder whose checksums (written by
    :func:`~kdplug.storage.atomic_directory`) name exactly its files (or, for teacher outputs, the metadata
    naming its own key), or a teacher head's file with the JSON record kdplug writes beside it. Anything
    else (a model folder or a student package a user keeps there, a file dropped in) is not touched."""
    from ..engine.cache import read_meta

    key = paths[0].name.split(".")[0]
    if kind in SECTIONS and not KEY.fullmatch(key):
        return False
    if len(paths) == 1 and paths[0].is_dir() and not paths[0].is_symlink():
        folder = paths[0]
        if kind == "teacher-cache":
            meta = read_meta(folder)
            return meta is not None and meta.fingerprint == folder.name
        return _checksums_name_its_files(folder)
    if kind != "heads" or len(paths) < 2 or any(path.is_symlink() or not path.is_file() for path in paths):
        return False
    record = next((path for path in paths if path.name == f"{key}.json"), None)
    try:
        return record is not None and isinstance(json.loads(record.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return False


def _checksums_name_its_files(folder: Path) -> bool:
    """A checksum record that names every file of ``folder`` and no other (an empty or forged one does not)."""
    from ..layout import CHECKSUMS_FILE
    from ..storage import recorded_checksums

    sums = recorded_checksums(folder)
    files = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() or path.is_symlink()}
    return bool(sums) and set(sums) == files - {CHECKSUMS_FILE}


def _leftover(path: Path, stale: set[Path]) -> Optional[Item]:
    """A staging file or folder, a damaged copy set aside or a previous copy (kdplug's own names)."""
    from ..storage import DAMAGED_SUFFIX, PREVIOUS_SUFFIX, is_kdplug_staging, staging_target

    name = path.name
    if path.is_symlink():
        return None
    kind, key = path.parent.name, (staging_target(name) or name).split(".")[0]
    if kind in SECTIONS and not KEY.fullmatch(key):  # kdplug's leftovers carry the key they were written for
        return None
    damaged = (  # a copy kdplug set aside carries its key, in a plugin's store too (photos.damaged-... is a user's)
        path.is_dir()
        and KEY.fullmatch(key) is not None
        and re.search(rf"{re.escape(DAMAGED_SUFFIX)}-\d{{8}}-\d{{6}}$", name) is not None
    )
    previous = name.endswith(PREVIOUS_SUFFIX) and written_by_kdplug(kind, [path])
    if not (damaged or previous or is_kdplug_staging(path)):
        return None
    leftover = path in stale or damaged or previous
    info = (
        "damaged copy set aside" if damaged else "staging folder of a killed run" if leftover else "being written now"
    )
    return Item(path.parent.name, name, [path], _size(path), info, stale=leftover)


def items(root: Path, kinds: Iterable[str]) -> list[Item]:
    """Every entry under ``root``'s ``kinds``; what kdplug did not write is an item marked :data:`NOT_OURS`."""
    from ..storage import stale_staging

    stale = set(stale_staging(root))
    found: list[Item] = []
    for kind in kinds:
        directory = root / kind
        if not directory.is_dir():
            continue
        entries: dict[str, list[Path]] = {}
        for path in sorted(directory.iterdir()):
            if path.name.endswith(".lock") and path.is_file() and not path.is_symlink():
                continue
            leftover = _leftover(path, stale)
            if leftover is not None:
                found.append(leftover)
                continue
            entries.setdefault(path.name.split(".")[0], []).append(path)
        for key, paths in entries.items():
            if not written_by_kdplug(kind, paths):
                found.extend(Item(kind, path.name, [path], 0, NOT_OURS) for path in paths)
                continue
            main = paths[0]
            info = _teacher_info(main) if kind == "teachers" else _cache_info(main) if kind == "teacher-cache" else ""
            found.append(Item(kind, key, paths, sum(_size(p) for p in paths), info))
    return found


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..storage import default_cache_root

    root = Path(args.cache_dir).expanduser() if args.cache_dir else default_cache_root()
    known = sections(manager.registry)
    if args.action == "list":
        return list_entries(root, known)
    if args.kind is not None and args.kind not in known:
        raise UsageError(f"--kind {args.kind!r} is not a kind of cache entry; the kinds: {', '.join(known)}")
    return clear_entries(root, known, kind=args.kind, key=args.key, stale=args.stale)


def list_entries(root: Path, known: dict[str, str]) -> int:
    print(f"cache: {root}")
    entries = items(root, known)
    total = 0
    for kind, title in known.items():
        group = [item for item in entries if item.kind == kind]
        if not group:
            continue
        print(f"{title} ({kind}):")
        for item in group:
            if item.info == NOT_OURS:
                print(f"  {item.key}  {NOT_OURS}")
                continue
            total += item.size
            modified = time.strftime("%Y-%m-%d %H:%M", time.localtime(item.paths[0].stat().st_mtime))
            flag = "  [stale: 'kdplug cache clear --stale' removes it]" if item.stale else ""
            print(f"  {item.key}  {item.size / 2**20:8.1f} MiB  {modified}  {item.info}{flag}".rstrip())
    print(f"total {total / 2**20:.1f} MiB")
    return 0


#: the shortest key prefix ``--key`` takes: shorter ones easily match entries nobody meant
MIN_KEY_PREFIX = 4


def check_key(key: str, entries: list[Item]) -> None:
    """``--key`` names entries: not blank (an unset shell variable), and a prefix of at least
    :data:`MIN_KEY_PREFIX` characters unless it is a whole key."""
    if not key.strip():
        raise UsageError(
            "--key is empty (an unset shell variable?); give an entry's key, or its first "
            f"{MIN_KEY_PREFIX} or more characters, as 'kdplug cache list' shows it; 'kdplug cache clear' without "
            "--key removes every entry"
        )
    if len(key) < MIN_KEY_PREFIX and not any(item.key == key for item in entries):
        raise UsageError(
            f"--key {key!r} is too short to name an entry: give at least {MIN_KEY_PREFIX} characters of its key, "
            f"as 'kdplug cache list' shows it"
        )


def in_use(item: Item, root: Path) -> bool:
    """Whether a running kdplug holds the entry's lock (it is building or storing it now)."""
    from ..storage import WriterLock

    return WriterLock.holder(root / item.kind / f"{item.key}.lock") is not None


def clear_entries(
    root: Path, known: dict[str, str], *, kind: Optional[str] = None, key: Optional[str] = None, stale: bool = False
) -> int:
    everything = items(root, known)
    entries = [item for item in everything if item.info != NOT_OURS]
    if key is not None:
        check_key(key, entries)
    chosen = [
        item
        for item in entries
        if (kind is None or item.kind == kind)
        and (key is None or item.key.startswith(key))
        and (item.stale if stale else True)
        and (stale or item.info != "being written now")
    ]
    if key is not None and not chosen:
        raise UsageError(f"no cache entry's key starts with {key!r}; 'kdplug cache list' shows the keys")
    busy = [item for item in chosen if not item.stale and in_use(item, root)]
    freed = 0
    for item in chosen:
        if item in busy:
            continue
        for path in item.paths:
            freed += _size(path)
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    for folder in {item.kind for item in chosen}:
        _tidy(root / folder)
    what = "stale entries" if stale else "entries"
    matched = f" whose key starts with {key!r}" if key is not None else ""
    print(f"removed {len(chosen) - len(busy)} {what}{matched} from {root} ({freed / 2**20:.1f} MiB freed)")
    for item in busy:
        print(f"kept {item.kind}/{item.key}: a running kdplug is writing it; clear it once that run has finished")
    for item in everything:
        if item.info == NOT_OURS and (kind is None or item.kind == kind) and key is None and not stale:
            print(f"{NOT_OURS}: {root / item.kind / item.key}")
    return 0


def _tidy(directory: Path) -> None:
    """Drop the lock files no process holds, then the folder itself if nothing is left."""
    import fcntl

    from ..storage import is_kdplug_lock, open_own_file

    for lock in directory.glob("*.lock"):
        if not is_kdplug_lock(lock):  # a user's file (an empty notes.lock), or a link: left alone
            continue
        if directory.name in SECTIONS and not KEY.fullmatch(lock.name.removesuffix(".lock")):  # a user's file
            continue
        with open_own_file(lock, "lock file") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a run is using it
            if not any(p.name.startswith(lock.name.removesuffix(".lock")) for p in directory.iterdir() if p != lock):
                lock.unlink()
            fcntl.flock(handle, fcntl.LOCK_UN)
    if directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()

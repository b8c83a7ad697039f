"""``kdplug cache list|clear``: the fine-tuned teachers, teacher outputs and heads on disk."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from ..plugins import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cache", help="show or free the teacher cache, fine-tuned teachers and heads",
                            description="The cache holds fine-tuned teachers, teacher outputs and warmed-up heads, "
                                        "each keyed by a fingerprint of what produced it.")
    parser.add_argument("action", choices=["list", "clear"], help="list: show entries and sizes; clear: delete them")
    parser.add_argument("--cache-dir", dest="cache_dir", help="default: $KDPLUG_CACHE or ~/.cache/kdplug")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..engine.cache import default_cache_root, list_caches

    root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
    sections = {"teacher-cache": "teacher outputs", "teachers": "fine-tuned teachers", "heads": "teacher heads"}
    if args.action == "clear":
        freed = 0
        for name in sections:
            directory = root / name
            if directory.exists():
                freed += sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
                shutil.rmtree(directory)
        print(f"cleared {root} ({freed / 2**20:.1f} MiB freed)")
        return 0
    print(f"cache: {root}")
    total = 0
    for name, title in sections.items():
        directory = root / name
        items = list_caches(directory) if name != "heads" else []
        files = sorted(directory.glob("*.safetensors")) if name == "heads" and directory.exists() else []
        if not items and not files:
            continue
        print(f"{title}:")
        for path, meta, size in items:
            total += size
            info = meta.description if meta is not None else "incomplete"
            extra = f" {meta.num_examples} examples" if meta is not None else ""
            print(f"  {path.name}  {size / 2**20:8.1f} MiB{extra}  {info}")
        for path in files:
            total += path.stat().st_size
            print(f"  {path.stem}  {path.stat().st_size / 2**20:8.1f} MiB")
    print(f"total {total / 2**20:.1f} MiB")
    return 0

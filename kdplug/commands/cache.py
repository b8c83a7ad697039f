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


#: what lives under the cache root: folder -> (title, file pattern; None: one directory per entry)
SECTIONS = {
    "teachers": ("fine-tuned teachers", None),
    "teacher-cache": ("teacher outputs", None),
    "heads": ("teacher heads", "*.safetensors"),
    "takd": ("trained teacher assistants (TAKD)", None),
    "sentencepiece": ("SentencePiece student tokenizers", "*.model"),
}


def _describe(meta) -> str:
    if meta is None:
        return ""
    details = ", ".join(f"{key} {value}" for key, value in meta.description.items())
    return f"{meta.num_examples} examples; {details}"


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from ..engine.cache import list_caches
    from ..storage import default_cache_root

    root = Path(args.cache_dir) if args.cache_dir else default_cache_root()
    if args.action == "clear":
        freed = 0
        for name in SECTIONS:
            directory = root / name
            if directory.exists():
                freed += sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
                shutil.rmtree(directory)
        print(f"cleared {root} ({freed / 2**20:.1f} MiB freed)")
        return 0
    print(f"cache: {root}")
    total = 0
    for name, (title, pattern) in SECTIONS.items():
        directory = root / name
        if pattern is None:
            items = [(path.name, size, _describe(meta)) for path, meta, size in list_caches(directory)]
        else:
            files = sorted(directory.glob(pattern)) if directory.exists() else []
            items = [(path.stem, path.stat().st_size, "") for path in files]
        if not items:
            continue
        print(f"{title}:")
        for key, size, info in items:
            total += size
            print(f"  {key}  {size / 2**20:8.1f} MiB  {info}".rstrip())
    print(f"total {total / 2**20:.1f} MiB")
    return 0

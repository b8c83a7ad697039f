"""The teacher cache: every teacher output a run needs, computed once, memory-mapped from disk.

The teacher never changes during distillation, so its logits and per-layer vectors are
computed in one pass and stored in half precision (layers) and fp32 (logits), keyed by a
fingerprint of teacher weights, tokenizer, data and extractor. Later epochs, students,
projectors and runs read rows by example index; memory stays flat as the data grows, since
only the rows of the current batch are paged in.

Safety: a cache is built in a temporary directory and renamed into place only when complete
(with checksums in ``meta.json``); a file lock makes a second process wait for the first
instead of building twice; a truncated or corrupted cache fails its check and is rebuilt.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from .. import fingerprint
from ..storage import file_lock, raise_as_storage_error, staging_directory
from ..types import LayerSpec
from . import faults

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOGITS_FILE, LAYERS_FILE, META_FILE = "logits.f32", "layers.f16", "meta.json"

#: a batch of teacher outputs: (example indices, logits (B, C), one (B, w_i) tensor per layer)
CacheBatch = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]


@dataclass
class CacheMeta:
    fingerprint: str
    num_examples: int
    num_outputs: int
    layers: list[dict]
    checksums: dict[str, str]
    description: dict
    created: float
    version: int = FORMAT_VERSION

    @property
    def specs(self) -> list[LayerSpec]:
        return [LayerSpec(**layer) for layer in self.layers]

    @property
    def total_width(self) -> int:
        return sum(layer["width"] for layer in self.layers)


class TeacherCache:
    """Read access to one cached split."""

    def __init__(self, directory: Path, meta: CacheMeta, *, built: bool = False) -> None:
        self.directory = directory
        self.meta = meta
        self.built = built  # computed by this process (False: found in the store)
        shape_logits = (meta.num_examples, meta.num_outputs)
        shape_layers = (meta.num_examples, meta.total_width)
        self.logits = np.memmap(directory / LOGITS_FILE, dtype=np.float32, mode="r", shape=shape_logits)
        self.layers = np.memmap(directory / LAYERS_FILE, dtype=np.float16, mode="r", shape=shape_layers)
        self._offsets = np.cumsum([0] + [layer["width"] for layer in meta.layers]).tolist()

    @property
    def specs(self) -> list[LayerSpec]:
        return self.meta.specs

    def __len__(self) -> int:
        return self.meta.num_examples

    def fetch(self, index: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Teacher logits ``(B, C)`` and layer vectors (each ``(B, w_i)``, fp32) for ``index``."""
        rows = index.cpu().numpy()
        logits = torch.from_numpy(np.ascontiguousarray(self.logits[rows])).to(device)
        flat = torch.from_numpy(np.ascontiguousarray(self.layers[rows])).to(device=device, dtype=torch.float32)
        layers = [flat[:, a:b] for a, b in zip(self._offsets[:-1], self._offsets[1:])]
        return logits, layers


class ConcatCache:
    """The teacher's outputs on the training split followed by a transfer set's (see data.WithTransfer)."""

    def __init__(self, labelled: TeacherCache, transfer: TeacherCache) -> None:
        if labelled.meta.layers != transfer.meta.layers or labelled.meta.num_outputs != transfer.meta.num_outputs:
            raise ValueError("the training and transfer caches hold different teacher layers")
        self.labelled, self.transfer = labelled, transfer
        self.meta = labelled.meta

    @property
    def specs(self) -> list[LayerSpec]:
        return self.labelled.specs

    def __len__(self) -> int:
        return len(self.labelled) + len(self.transfer)

    def fetch(self, index: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
        first = len(self.labelled)
        in_transfer = index >= first
        if not bool(in_transfer.any()):
            return self.labelled.fetch(index, device)
        if bool(in_transfer.all()):
            return self.transfer.fetch(index - first, device)
        logits_a, layers_a = self.labelled.fetch(index[~in_transfer], device)
        logits_b, layers_b = self.transfer.fetch(index[in_transfer] - first, device)
        rows = in_transfer.to(device)
        logits = logits_a.new_empty((len(index), logits_a.shape[1]))
        logits[~rows], logits[rows] = logits_a, logits_b
        layers = []
        for a, b in zip(layers_a, layers_b):
            merged = a.new_empty((len(index), a.shape[1]))
            merged[~rows], merged[rows] = a, b
            layers.append(merged)
        return logits, layers


def is_cached(root: Path, key: str) -> bool:
    """Whether ``root/key`` holds a complete cache; its sizes are checked, its checksums only when
    it is opened (reading every byte would take a dry run as long as the cache is large)."""
    try:
        meta = CacheMeta(**json.loads((root / key / META_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return False
    expected = {
        LOGITS_FILE: meta.num_examples * meta.num_outputs * 4,
        LAYERS_FILE: meta.num_examples * meta.total_width * 2,
    }
    return meta.version == FORMAT_VERSION and all(
        (root / key / name).is_file() and (root / key / name).stat().st_size == size for name, size in expected.items()
    )


def _verify(directory: Path) -> Optional[CacheMeta]:
    """The cache's metadata if its files are complete and intact, else None (with the reason logged)."""
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        return None
    try:
        meta = CacheMeta(**json.loads(meta_path.read_text()))
    except (ValueError, TypeError) as exc:
        log.warning("teacher cache %s has an unreadable meta.json (%s); rebuilding it", directory, exc)
        return None
    if meta.version != FORMAT_VERSION:
        return None
    expected = {
        LOGITS_FILE: meta.num_examples * meta.num_outputs * 4,
        LAYERS_FILE: meta.num_examples * meta.total_width * 2,
    }
    for name, size in expected.items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != size:
            log.warning("teacher cache %s: %s is missing or truncated; rebuilding it", directory, name)
            return None
        if fingerprint.of_file(str(path)) != meta.checksums.get(name):
            log.warning("teacher cache %s: %s fails its checksum (corrupted); rebuilding it", directory, name)
            return None
    return meta


def open_or_build(
    root: Path,
    key: str,
    *,
    num_examples: int,
    num_outputs: int,
    specs: list[LayerSpec],
    compute: Callable[[], Iterable[CacheBatch]],
    description: dict,
    progress: Callable[[Iterable, int], Iterable] = lambda it, n: it,
) -> TeacherCache:
    """The cache for ``key`` under ``root``, built by ``compute`` unless a valid one exists."""
    root.mkdir(parents=True, exist_ok=True)
    directory = root / key
    with file_lock(root / f"{key}.lock"):
        meta = _verify(directory)
        if meta is not None:
            log.info("teacher cache hit: %s", directory)
            return TeacherCache(directory, meta)
        log.info("building the teacher cache %s (%d examples)", directory, num_examples)
        staging = staging_directory(root, key)
        try:
            faults.fire_at("cache-write")
            meta = _write(staging, key, num_examples, num_outputs, specs, compute, description, progress)
            if directory.exists():  # an incomplete or corrupted copy, already reported by _verify
                shutil.rmtree(directory)
            os.replace(staging, directory)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise_as_storage_error(
                exc,
                f"the teacher cache {directory}",
                "nothing was cached and nothing else was changed; free space (or raise the limit) and run again",
            )
            raise
    return TeacherCache(directory, meta, built=True)


def _write(
    staging: Path,
    key: str,
    num_examples: int,
    num_outputs: int,
    specs: list[LayerSpec],
    compute: Callable[[], Iterable[CacheBatch]],
    description: dict,
    progress,
) -> CacheMeta:
    total_width = sum(spec.width for spec in specs)
    logits_map = np.memmap(staging / LOGITS_FILE, dtype=np.float32, mode="w+", shape=(num_examples, num_outputs))
    layers_map = np.memmap(staging / LAYERS_FILE, dtype=np.float16, mode="w+", shape=(num_examples, total_width))
    seen = np.zeros(num_examples, dtype=bool)
    for index, logits, layers in progress(compute(), num_examples):
        rows = index.cpu().numpy()
        logits_map[rows] = logits.detach().float().cpu().numpy()
        layers_map[rows] = (
            torch.cat([layer.detach().float() for layer in layers], dim=1).cpu().numpy().astype(np.float16)
        )
        seen[rows] = True
    if not seen.all():
        raise RuntimeError(f"teacher cache {key}: {int((~seen).sum())} examples were not computed")
    logits_map.flush()
    layers_map.flush()
    del logits_map, layers_map
    meta = CacheMeta(
        fingerprint=key,
        num_examples=num_examples,
        num_outputs=num_outputs,
        layers=[{"index": s.index, "width": s.width, "kind": s.kind} for s in specs],
        checksums={name: fingerprint.of_file(str(staging / name)) for name in (LOGITS_FILE, LAYERS_FILE)},
        description=description,
        created=time.time(),
    )
    (staging / META_FILE).write_text(json.dumps(meta.__dict__, indent=1))
    return meta

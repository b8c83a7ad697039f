"""The teacher cache: every teacher output a run reads, computed once, memory-mapped from disk.

The teacher never changes during distillation, so its outputs are computed in one pass and
stored, one row per example, in two kinds of entry, each keyed by a fingerprint: a split's
**logits** (fp32; keyed by teacher weights, tokenizer, data and precision) and its **layer
vectors** (fp16; keyed by the logits' key and the layers). A logit-only method (rkd,
annealing, TAKD: ``reads_teacher_layers = False``) reads only the first, and its run computes and
stores no layer vector: on BERT-base those are about 18 KB an example, 99.8% of what the cache
held when both lived in one entry. A later layer method on the same data adds the layers entry beside the
stored logits, which it reuses and never writes again. Later epochs, students, projectors and
runs read rows by example index; memory stays flat as the data grows, since only the rows of the
current batch are paged in.

Safety: each entry is built in a temporary directory and renamed into place only when complete
(with checksums in ``meta.json``); a file lock per entry makes a second process wait for the
first instead of building twice; a truncated or corrupted entry fails its check and is rebuilt.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from .. import fingerprint
from ..storage import raise_as_storage_error, staging_directory, unmark_staging
from ..types import LayerSpec
from . import faults, shares
from .shares import ONE_PROCESS, Processes

log = logging.getLogger(__name__)

#: 2: logits and layer vectors in separate entries (format 1 held both in one; such entries are
#: never read, a run computes what it needs again, and ``kdplug cache`` lists and clears them)
FORMAT_VERSION = 2
LOGITS_FILE, LAYERS_FILE, META_FILE = "logits.f32", "layers.f16", "meta.json"
#: the two kinds of entry
LOGITS, LAYERS = "logits", "layers"

#: a batch of teacher outputs: (example indices, logits (B, C), one (B, w_i) tensor per layer; none
#: when the pass computes no layers)
CacheBatch = tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]


def logits_bytes(num_examples: int, num_outputs: int) -> int:
    """What a logits entry's data file holds: fp32 logits, one row per example."""
    return num_examples * num_outputs * 4


def layers_bytes(num_examples: int, widths: Iterable[int]) -> int:
    """What a layers entry's data file holds: every layer's vector in fp16, one row per example."""
    return num_examples * sum(widths) * 2


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
    kind: str = LOGITS
    #: a layers entry: the key of the logits entry of the same teacher and data
    logits: Optional[str] = None

    @property
    def specs(self) -> list[LayerSpec]:
        return [LayerSpec(**layer) for layer in self.layers]

    @property
    def total_width(self) -> int:
        return sum(layer["width"] for layer in self.layers)

    @property
    def data_file(self) -> str:
        return LAYERS_FILE if self.kind == LAYERS else LOGITS_FILE

    @property
    def data_bytes(self) -> int:
        if self.kind == LAYERS:
            return layers_bytes(self.num_examples, (layer["width"] for layer in self.layers))
        return logits_bytes(self.num_examples, self.num_outputs)

    def open(self, directory: Path) -> np.memmap:
        dtype, width = (np.float16, self.total_width) if self.kind == LAYERS else (np.float32, self.num_outputs)
        return np.memmap(directory / self.data_file, dtype=dtype, mode="r", shape=(self.num_examples, width))


def read_meta(directory: Path) -> Optional[CacheMeta]:
    """The entry's metadata as written (any format version), None where there is none to read."""
    try:
        return CacheMeta(**json.loads((directory / META_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


@dataclass
class Entry:
    """One stored entry: a split's logits or its layer vectors, memory-mapped."""

    directory: Path
    meta: CacheMeta
    built: bool = False  # computed by this process (False: found in the store)
    array: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.array = self.meta.open(self.directory)

    @property
    def key(self) -> str:
        return self.meta.fingerprint

    def record(self) -> dict[str, Any]:
        """What metrics.json says of it: key, bytes, and whether it was reused."""
        return {"key": self.key, "bytes": self.meta.data_bytes, "reused": not self.built}


class TeacherCache:
    """Read access to one cached split: its logits, and its layer vectors where the run reads them."""

    def __init__(
        self, logits: Entry, layers: Optional[Entry] = None, computed_by: Optional[list[dict[str, Any]]] = None
    ) -> None:
        self.logits_entry, self.layers_entry = logits, layers
        #: what each process computed of it in this run (rank, examples, seconds); empty when all was reused
        self.computed_by = computed_by or []
        self.logits = logits.array
        self.layers = layers.array if layers is not None else None
        self.specs: list[LayerSpec] = layers.meta.specs if layers is not None else []
        self._offsets = np.cumsum([0] + [spec.width for spec in self.specs]).tolist()

    @property
    def has_layers(self) -> bool:
        return self.layers_entry is not None

    @property
    def num_outputs(self) -> int:
        return self.logits_entry.meta.num_outputs

    @property
    def fingerprint(self) -> str:
        """The key of what the split's outputs hold: its layers entry's where it has one."""
        return (self.layers_entry or self.logits_entry).key

    @property
    def built(self) -> bool:
        """Whether this process computed any of it (False: all of it was found in the store)."""
        return any(entry.built for entry in (self.logits_entry, self.layers_entry) if entry is not None)

    def record(self) -> dict[str, Any]:
        """The bytes of logits and of layers, and whether each was reused (metrics.json's ``teacher.cache``)."""
        return {
            "examples": len(self),
            LOGITS: self.logits_entry.record(),
            LAYERS: self.layers_entry.record() if self.layers_entry is not None else None,
            **({"computed_by": self.computed_by} if self.computed_by else {}),
        }

    def __len__(self) -> int:
        return self.logits_entry.meta.num_examples

    def fetch(self, index: torch.Tensor, device: torch.device | str = "cpu") -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Teacher logits ``(B, C)`` and layer vectors (each ``(B, w_i)``, fp32; none without layers) for ``index``."""
        rows = index.cpu().numpy()
        logits = torch.from_numpy(np.ascontiguousarray(self.logits[rows])).to(device)
        if self.layers is None:
            return logits, []
        flat = torch.from_numpy(np.ascontiguousarray(self.layers[rows])).to(device=device, dtype=torch.float32)
        layers = [flat[:, a:b] for a, b in zip(self._offsets[:-1], self._offsets[1:])]
        return logits, layers


class ConcatCache:
    """The teacher's outputs on the training split followed by a transfer set's (see data.WithTransfer)."""

    def __init__(self, labelled: TeacherCache, transfer: TeacherCache) -> None:
        if labelled.specs != transfer.specs or labelled.num_outputs != transfer.num_outputs:
            raise ValueError("the training and transfer caches hold different teacher layers")
        self.labelled, self.transfer = labelled, transfer

    @property
    def specs(self) -> list[LayerSpec]:
        return self.labelled.specs

    @property
    def has_layers(self) -> bool:
        return self.labelled.has_layers

    @property
    def fingerprint(self) -> str:
        return self.labelled.fingerprint

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
    """Whether ``root/key`` holds a complete entry; its size is checked, its checksum only when
    it is opened (reading every byte would take a dry run as long as the cache is large)."""
    meta = read_meta(root / key)
    if meta is None or meta.version != FORMAT_VERSION:
        return False
    path = root / key / meta.data_file
    return path.is_file() and path.stat().st_size == meta.data_bytes


def _verify(directory: Path) -> Optional[CacheMeta]:
    """The entry's metadata if its data file is complete and intact, else None (with the reason logged)."""
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
    path = directory / meta.data_file
    if not path.is_file() or path.stat().st_size != meta.data_bytes:
        log.warning("teacher cache %s: %s is missing or truncated; rebuilding it", directory, meta.data_file)
        return None
    if fingerprint.of_file(str(path)) != meta.checksums.get(meta.data_file):
        log.warning("teacher cache %s: %s fails its checksum (corrupted); rebuilding it", directory, meta.data_file)
        return None
    return meta


def open_or_build(
    root: Path,
    logits_key: str,
    *,
    layers_key: Optional[str] = None,
    num_examples: int,
    num_outputs: int,
    specs: list[LayerSpec],
    compute: Callable[[bool, range], Iterable[CacheBatch]],
    description: dict,
    progress: Callable[[Iterable, int], Iterable] = lambda it, n: it,
    processes: Processes = ONE_PROCESS,
    align: int = 1,
) -> TeacherCache:
    """A split's teacher outputs under ``root``: its logits entry ``logits_key`` and, where
    ``layers_key`` is given, its layers entry (``specs``). What is missing or damaged is computed
    by one pass of ``compute(with_layers, rows)`` over the examples ``rows``; an entry found intact
    is reused and never written again.

    Under a launch of several ``processes``, each computes its share of the rows (cut at
    multiples of ``align``, the pass's batch size) and rank 0 joins the shares into the entries,
    equal to what one process builds; every rank returns the same entries."""
    root.mkdir(parents=True, exist_ok=True)
    keys = {LOGITS: logits_key, **({LAYERS: layers_key} if layers_key else {})}
    plan = _Plan(root, keys, num_examples, num_outputs, specs, description, processes, align)
    found: dict[str, Optional[CacheMeta]] = {}

    def check() -> dict[str, Any]:
        found.update({kind: _verify(root / key) for kind, key in keys.items()})
        for kind, meta in found.items():
            if meta is not None:
                log.info("teacher cache hit: %s (%s, reused)", root / keys[kind], kind)
        missing = [kind for kind, meta in found.items() if meta is None]
        return {"missing": missing, "build": bool(missing)}

    locks = [
        root / f"{key}.lock" for key in keys.values()
    ]  # always the logits first: no two builders wait on each other
    computed_by: list[dict[str, Any]] = []
    with shares.lead_or_follow(
        processes, plan.what, locks=locks, check=check, staging=root / f"{logits_key}.shares"
    ) as build:
        missing = build.order["missing"]
        if missing and processes.leads:
            metas, computed_by = plan.build(missing, compute, progress, build)
            found.update(metas)
        elif missing:
            plan.compute_share(missing, compute, progress, build)
    if not processes.leads:
        found = {kind: plan.stored(kind) for kind in keys}
    entries = {kind: Entry(root / keys[kind], meta, built=kind in missing) for kind, meta in found.items() if meta}
    return TeacherCache(entries[LOGITS], entries.get(LAYERS), computed_by)


@dataclass
class _Plan:
    """What one split's teacher pass writes, and how its processes share it."""

    root: Path
    keys: dict[str, str]
    num_examples: int
    num_outputs: int
    specs: list[LayerSpec]
    description: dict
    processes: Processes
    align: int

    @property
    def what(self) -> str:
        return f"the teacher pass over {self.description.get('split', 'a split')}"

    def templates(self, kinds: Iterable[str], num_examples: Optional[int] = None) -> dict[str, CacheMeta]:
        return {
            kind: CacheMeta(
                fingerprint=self.keys[kind],
                num_examples=self.num_examples if num_examples is None else num_examples,
                num_outputs=self.num_outputs,
                layers=[{"index": s.index, "width": s.width, "kind": s.kind} for s in self.specs]
                if kind == LAYERS
                else [],
                checksums={},
                description=self.description,
                created=0.0,
                kind=kind,
                logits=self.keys[LOGITS] if kind == LAYERS else None,
            )
            for kind in kinds
        }

    def share(self, rank: int) -> range:
        return shares.share(self.num_examples, rank, self.processes.count, self.align)

    def build(
        self, missing: list[str], compute, progress, build: shares.Build
    ) -> tuple[dict[str, CacheMeta], list[dict[str, Any]]]:
        """Rank 0: the missing entries, computed alone or joined from every process's share."""
        log.info(
            "building the teacher cache %s (%d examples: %s%s)",
            ", ".join(str(self.root / self.keys[kind]) for kind in missing),
            self.num_examples,
            " and ".join(missing),
            f", shared by {self.processes.count} processes" if build.shared else "",
        )
        templates = self.templates(missing)
        with_layers = LAYERS in templates
        if not build.shared:
            started = time.perf_counter()
            metas = _build(self.root, templates, lambda: compute(with_layers, range(self.num_examples)), progress)
            return metas, [_share_record(0, self.num_examples, started)]
        records = self.compute_share(missing, compute, progress, build)
        metas = _build(self.root, templates, lambda: self._joined(build, templates), lambda it, n: it)
        log.info(
            "%s: %d processes computed %s examples",
            self.what,
            len(records),
            " + ".join(str(record["examples"]) for record in records),
        )
        return metas, records

    def compute_share(self, missing: list[str], compute, progress, build: shares.Build) -> list[dict[str, Any]]:
        """This process's share of the pass, written into its share directory; every rank's record."""
        rank, rows = self.processes.rank, self.share(self.processes.rank)
        templates = self.templates(missing, num_examples=len(rows))

        def write(directory: Path) -> dict[str, Any]:
            if not rows:  # fewer batches than processes
                return {}
            stagings = {kind: directory / kind for kind in templates}
            for staging in stagings.values():
                staging.mkdir()

            def batches() -> Iterable[CacheBatch]:
                for index, logits, layers in compute(LAYERS in templates, rows):
                    faults.fire_at(f"teacher-share-rank{rank}")
                    yield index - rows.start, logits, layers

            _write(stagings, templates, batches, progress)
            return {}

        try:
            return build.share(write, len(rows))
        except shares.ShareFailed:
            raise
        except BaseException as exc:
            raise_as_storage_error(exc, f"this process's share of {self.what}", "nothing was cached")
            raise

    def _joined(self, build: shares.Build, templates: dict[str, CacheMeta]) -> Iterable[CacheBatch]:
        """Every process's share, read back in order of the rows, in chunks."""
        for rank in range(self.processes.count):
            rows = self.share(rank)
            if not rows:
                continue
            arrays = {}
            for kind in templates:
                meta = _verify(build.share_dir(rank) / kind)
                if meta is None:
                    raise shares.ShareFailed(rank, "left a share that is incomplete or corrupted", self.what)
                arrays[kind] = meta.open(build.share_dir(rank) / kind)
            for start in range(0, len(rows), JOIN_ROWS):
                stop = min(start + JOIN_ROWS, len(rows))
                index = torch.arange(rows.start + start, rows.start + stop)
                logits = torch.from_numpy(np.array(arrays[LOGITS][start:stop])) if LOGITS in arrays else None
                layers = [torch.from_numpy(np.array(arrays[LAYERS][start:stop]))] if LAYERS in arrays else []
                yield index, logits, layers

    def stored(self, kind: str) -> CacheMeta:
        """Another rank: the entry rank 0 found or built, now in place."""
        directory = self.root / self.keys[kind]
        meta = read_meta(directory) if is_cached(self.root, self.keys[kind]) else None
        if meta is None:
            raise RuntimeError(f"{directory}: rank 0 found this teacher cache entry, but it is gone")
        return meta


#: rows of a share read back at a time when the shares are joined
JOIN_ROWS = 8192


def _share_record(rank: int, examples: int, started: float) -> dict[str, Any]:
    return {"rank": rank, "examples": examples, "seconds": round(time.perf_counter() - started, 3)}


def _build(
    root: Path, templates: dict[str, CacheMeta], compute: Callable[[], Iterable[CacheBatch]], progress
) -> dict[str, CacheMeta]:
    """Write the entries of ``templates`` from one pass of ``compute``, each in a staging directory
    renamed into place only once every entry of the pass is complete: a failure leaves none."""
    stagings: dict[str, Path] = {}
    try:
        for kind, meta in templates.items():
            stagings[kind] = staging_directory(root, meta.fingerprint)
        faults.fire_at("cache-write")
        metas = _write(stagings, templates, compute, progress)
        for kind in templates:  # the logits first: a layers entry always has its logits beside it
            directory = root / templates[kind].fingerprint
            if directory.exists():  # an incomplete or corrupted copy, already reported by _verify
                shutil.rmtree(directory)
            unmark_staging(stagings[kind])
            os.replace(stagings.pop(kind), directory)
    except BaseException as exc:
        for staging in stagings.values():
            shutil.rmtree(staging, ignore_errors=True)
        raise_as_storage_error(
            exc,
            f"the teacher cache {', '.join(str(root / meta.fingerprint) for meta in templates.values())}",
            "nothing was cached and nothing else was changed; free space (or raise the limit) and run again",
        )
        raise
    return metas


def _write(
    stagings: dict[str, Path], templates: dict[str, CacheMeta], compute: Callable[[], Iterable[CacheBatch]], progress
) -> dict[str, CacheMeta]:
    any_meta = next(iter(templates.values()))
    num_examples = any_meta.num_examples
    maps = {
        kind: np.memmap(
            stagings[kind] / meta.data_file,
            dtype=np.float16 if kind == LAYERS else np.float32,
            mode="w+",
            shape=(num_examples, meta.total_width if kind == LAYERS else meta.num_outputs),
        )
        for kind, meta in templates.items()
    }
    seen = np.zeros(num_examples, dtype=bool)
    with _RunningChecksums(maps) as checksums:
        for index, logits, layers in progress(compute(), num_examples):
            rows = index.cpu().numpy()
            # converted on the device: fp16 crosses to the host at half the bytes, and no numpy cast
            if LOGITS in maps:
                checksums.write(LOGITS, rows, logits.detach().float().cpu().numpy())
            if LAYERS in maps:
                vectors = torch.cat([layer.detach().float() for layer in layers], dim=1).half()
                checksums.write(LAYERS, rows, vectors.cpu().numpy())
            seen[rows] = True
        if not seen.all():
            raise RuntimeError(f"teacher cache {any_meta.fingerprint}: {int((~seen).sum())} examples were not computed")
        for array in maps.values():
            array.flush()
        digests = checksums.digests()
    del maps
    metas = {}
    for kind, template in templates.items():
        path = stagings[kind] / template.data_file
        digest = digests.get(kind) or fingerprint.of_file(str(path))  # rows written out of order: read back
        meta = CacheMeta(**{**template.__dict__, "checksums": {template.data_file: digest}, "created": time.time()})
        (stagings[kind] / META_FILE).write_text(json.dumps(meta.__dict__, indent=1))
        metas[kind] = meta
    return metas


class _RunningChecksums:
    """Writes rows into the entries' arrays and hashes them as they are written, on a thread of its
    own while the teacher computes the next batch (hashlib lets go of the GIL), instead of reading
    every file back at the end. Rows that do not continue the file in order (no pass writes such)
    stop the running hash of that entry: its file is then hashed when it is complete."""

    def __init__(self, maps: dict[str, np.memmap]) -> None:
        self.maps = maps
        self.hashers: dict[str, Any] = {kind: fingerprint.hasher() for kind in maps}
        self.next_row = dict.fromkeys(maps, 0)
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kdplug-checksum")
        self.pending: list[concurrent.futures.Future] = []

    def __enter__(self) -> _RunningChecksums:
        return self

    def write(self, kind: str, rows: np.ndarray, values: np.ndarray) -> None:
        start = self.next_row[kind]
        if start is not None and np.array_equal(rows, np.arange(start, start + len(rows))):
            self.maps[kind][start : start + len(rows)] = values
            self.next_row[kind] = start + len(rows)
            values = np.ascontiguousarray(values, dtype=self.maps[kind].dtype)
            self.pending.append(self.pool.submit(self.hashers[kind].update, memoryview(values).cast("B")))
        else:
            self.maps[kind][rows] = values
            self.next_row[kind] = None
        for future in [future for future in self.pending if future.done()]:
            future.result()  # a hashing error surfaces here
            self.pending.remove(future)

    def digests(self) -> dict[str, str]:
        """Each entry's checksum, where its rows came in order and the file is complete."""
        concurrent.futures.wait(self.pending)
        for future in self.pending:
            future.result()
        return {
            kind: self.hashers[kind].hexdigest()
            for kind, row in self.next_row.items()
            if row is not None and row == len(self.maps[kind])
        }

    def __exit__(self, *exc_info: Any) -> None:
        self.pool.shutdown(wait=True)

"""Transfer sets: extra inputs the student learns the teacher's outputs on, without gold labels.

A transfer set comes from the user's files of unlabelled text (``--transfer``), from an
augmenter applied ``augment_factor`` times to every training example (``--augment``), or both.
It is built once and stored under ``<cache>/transfer/<fingerprint>``: the texts as JSONL, then,
per tokenizer, the token ids as flat memory-mapped arrays, so a transfer set many times the
training set is streamed from disk and never held as Python strings.

A transfer set holds each sentence once (Tang et al. 2019 discard every duplicate): a text equal,
case and spacing aside, to a dev example, to a training example, or to an earlier text of the set
is dropped, as is a degenerate copy with nothing but stop words, punctuation and special tokens
("[MASK] [MASK]", "the"); each kind is counted in ``transfer.json``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from .. import fingerprint
from ..capabilities import AugmenterCapabilities, capabilities
from ..config import RunConfig
from ..errors import UsageError
from ..registry import Registry
from ..storage import atomic_directory, complete_copy, verify
from ..textio import input_format, input_rows, jsonl_keys, open_text
from ..types import Example, Task, Teacher, text_columns
from . import augmenting, shares
from .augmenting import Text, augmented, normalised
from .data import EncodedSplit, TokenTable, packed

log = logging.getLogger(__name__)

TEXTS_FILE, META_FILE = "texts.jsonl", "transfer.json"
IDS_FILE, OFFSETS_FILE, TYPES_FILE = "ids.i32", "offsets.npy", "types.i8"
ENCODE_CHUNK = 1024  # texts tokenised at a time: memory stays flat whatever the set's size
FORMAT_VERSION = 2  # 2: duplicates dropped across the whole set and against train, degenerate copies
#: Tang et al. 2019's n_iter: 20 augmented copies of a sentence (SST-2), 10 of a pair (MNLI, QQP)
AUGMENT_FACTOR, PAIR_AUGMENT_FACTOR = 20, 10


def augment_factor(config: RunConfig, task: Task) -> int:
    """Augmented copies per training example: the run's, else Tang et al.'s for the task's kind."""
    if config.augment_factor is not None:
        return config.augment_factor
    return PAIR_AUGMENT_FACTOR if task.is_pair else AUGMENT_FACTOR


#: what a tokenizer with neither a mask token nor an unknown token of its own reads for a masked word
PLAIN_MASK = "[MASK]"


def boundary_tokens(tokenizer: Any) -> set[str]:
    """The tokens that begin, end, separate or pad a sequence for ``tokenizer``."""
    names = ("bos_token", "eos_token", "pad_token", "sep_token", "cls_token")
    return {token for token in (getattr(tokenizer, name, None) for name in names) if token}


# -- token ids on disk ---------------------------------------------------------------------------


@dataclass
class TransferSet:
    """A stored transfer set: its directory and what building it recorded."""

    directory: Path
    meta: dict[str, Any]

    @property
    def key(self) -> str:
        return self.directory.name

    def __len__(self) -> int:
        return int(self.meta["examples"])

    def texts(self, rows: Optional[range] = None) -> Iterator[Text]:
        """The set's texts, in order (those of ``rows`` alone, a share, when given)."""
        with open(self.directory / TEXTS_FILE, encoding="utf-8") as handle:
            lines = handle if rows is None else itertools.islice(handle, rows.start, rows.stop)
            for line in lines:
                record = json.loads(line)
                yield record[0], record[1] if len(record) > 1 else None

    def mask_for(self, tokenizer: Any) -> Optional[tuple[str, str]]:
        """``(the augmenter's mask token, what ``tokenizer`` reads instead)``, or None when it reads
        it as is. Tang et al. replace a masked word by [MASK], "an unknown token in our models and
        the masking token in BERT": a tokenizer's mask token, else its unknown token (a
        SentencePiece student's), not "[MASK]" cut into pieces. Never a token that begins, ends or
        pads a sequence: GPT-2's, Pythia's and Phi-2's unknown token is <|endoftext|>, their
        padding token too, which made a masked word a document boundary; such a tokenizer reads
        the text "[MASK]", a blank as a language model reads one (Zhao et al. 2021 use it as a
        content-free input)."""
        mask = self.meta.get("mask_token")
        if mask is None:
            return None
        # not through capabilities(): the tokenizer's own mask token
        own = getattr(tokenizer, "mask_token", None) or getattr(tokenizer, "unk_token", None)
        boundaries = boundary_tokens(tokenizer)
        if own in boundaries:
            own = None
        if own is None:
            own = PLAIN_MASK if mask in boundaries else mask  # an augment_options.mask_token that is one
        return None if own == mask else (mask, own)

    def encode(
        self,
        tokenizer: Any,
        max_length: int,
        *,
        is_regression: bool,
        processes: shares.Processes = shares.ONE_PROCESS,
    ) -> EncodedSplit:
        """The set tokenised by ``tokenizer``: stored beside the texts on first use, memory-mapped
        after. Every process of a launch calls it: each tokenises a share, rank 0 joins them."""
        mask = self.mask_for(tokenizer)
        key = fingerprint.of_values("transfer-encoding", fingerprint.of_tokenizer(tokenizer), max_length, mask)
        target = self.directory / f"encoded-{key}"
        lock = self.directory.parent / f"{self.key}.{key}.lock"

        def write(directory: Path, rows: range) -> None:
            texts = self.texts(rows)
            _write_encoding(directory, texts if mask is None else (_replace_word(t, *mask) for t in texts), len(rows),
                            tokenizer, max_length)  # fmt: skip

        def check() -> dict[str, Any]:
            return {"build": complete_copy(target) is None}

        with shares.lead_or_follow(
            processes, "tokenising the transfer set", locks=[lock], check=check,
            staging=self.directory.parent / f"{self.key}.{key}.shares",
        ) as build:  # fmt: skip
            if build.shared:
                rows = shares.share(len(self), processes.rank, processes.count)
                build.share(lambda directory: write(directory, rows) or {}, len(rows))
                if processes.leads:
                    with atomic_directory(target, f"the tokenised transfer set {target}") as staging:
                        parts = [build.share_dir(rank) for rank in range(processes.count)]
                        _join_encodings(staging, parts, len(self))
            elif processes.leads and build.order["build"]:
                with atomic_directory(target, f"the tokenised transfer set {target}") as staging:
                    write(staging, range(len(self)))
        directory = complete_copy(target)
        if directory is None:
            raise shares.ShareFailed(0, shares.LEAD_STOPPED, "tokenising the transfer set")
        offsets = np.load(directory / OFFSETS_FILE, mmap_mode="r")
        ids = (
            np.memmap(directory / IDS_FILE, dtype=np.int32, mode="r", shape=(int(offsets[-1]),))
            if offsets[-1]
            else np.zeros(0, dtype=np.int32)
        )
        types = None
        if (directory / TYPES_FILE).is_file():
            types = TokenTable(np.memmap(directory / TYPES_FILE, dtype=np.int8, mode="r", shape=ids.shape), offsets)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        table = TokenTable(ids, offsets)
        return EncodedSplit(
            input_ids=table,
            token_type_ids=types,
            labels=[0.0 if is_regression else 0] * len(table),
            is_regression=is_regression,
            pad_id=pad_id,
            token_fingerprint=key + self.key,
        )


def _join_encodings(directory: Path, parts: list[Path], count: int) -> None:
    """The encodings of consecutive shares of the texts, joined into the one a single pass writes."""
    offsets = np.lib.format.open_memmap(directory / OFFSETS_FILE, mode="w+", dtype=np.int64, shape=(count + 1,))
    offsets[0], written = 0, 0
    with_types = any((part / TYPES_FILE).is_file() for part in parts)
    with open(directory / IDS_FILE, "wb") as ids_file, open(directory / TYPES_FILE, "wb") as types_file:
        for part in parts:
            share = np.load(part / OFFSETS_FILE, mmap_mode="r")
            offsets[written + 1 : written + len(share)] = share[1:] + offsets[written]
            written += len(share) - 1
            with open(part / IDS_FILE, "rb") as ids:
                shutil.copyfileobj(ids, ids_file)
            if (part / TYPES_FILE).is_file():
                with open(part / TYPES_FILE, "rb") as types:
                    shutil.copyfileobj(types, types_file)
    if written != count:
        raise RuntimeError(f"the shares of the tokenised transfer set hold {written} texts, not {count}")
    offsets.flush()
    del offsets
    if not with_types:
        (directory / TYPES_FILE).unlink()


def _replace_word(text: Text, old: str, new: str) -> Text:
    def swap(part: Optional[str]) -> Optional[str]:
        return part if part is None or old not in part else " ".join(new if w == old else w for w in part.split())

    return swap(text[0]), swap(text[1])  # type: ignore[return-value]


def _write_encoding(directory: Path, texts: Iterable[Text], count: int, tokenizer: Any, max_length: int) -> None:
    """The ``count`` texts' token ids written chunk by chunk; the offsets too are written as they go
    (a memory-mapped file), so a set of millions of texts holds no per-text Python objects."""
    offsets = np.lib.format.open_memmap(directory / OFFSETS_FILE, mode="w+", dtype=np.int64, shape=(count + 1,))
    offsets[0], written, with_types = 0, 0, None
    with open(directory / IDS_FILE, "wb") as ids_file, open(directory / TYPES_FILE, "wb") as types_file:
        texts = iter(texts)
        while chunk := list(itertools.islice(texts, ENCODE_CHUNK)):
            first = [a for a, _ in chunk]
            second = [b for _, b in chunk] if chunk[0][1] is not None else None
            encoded = tokenizer(first, second, truncation=True, max_length=max_length)
            with_types = "token_type_ids" in encoded
            ids, lengths = packed(encoded["input_ids"], np.int32)
            ids_file.write(ids.tobytes())
            if with_types:
                types_file.write(packed(encoded["token_type_ids"], np.int8)[0].tobytes())
            np.cumsum(lengths, out=offsets[written + 1 : written + 1 + len(chunk)])
            offsets[written + 1 : written + 1 + len(chunk)] += offsets[written]
            written += len(chunk)
    if written != count:
        raise RuntimeError(f"the transfer set's texts file holds {written} texts where its record says {count}")
    offsets.flush()
    del offsets
    if not with_types:
        (directory / TYPES_FILE).unlink()


# -- building ------------------------------------------------------------------------------------


def read_transfer_file(path: str, task: Task) -> Iterator[Text]:
    """The texts of one ``--transfer`` source: a TSV/CSV/JSONL file with the task's text columns
    (or ``text``/``text_pair``), plain lines, or a directory that ``datasets`` saved."""
    source = Path(path).expanduser()
    if source.is_dir():
        yield from _read_dataset_dir(source, task)
        return
    fmt = input_format(str(source), None)
    name = str(source)
    keys = None
    if fmt == "jsonl":  # the columns are picked from every row's keys: a first pass reads them
        with open_text(source, option=None) as stream:
            keys = jsonl_keys(stream, name)
    with open_text(source, option=None) as stream:  # read as it goes, never whole
        _, items = input_rows(
            stream,
            fmt,
            name,
            text_columns(task),
            task.is_pair,
            None,
            consumer=f"a transfer set for task {task.name!r}",
            keys=keys,
        )
        for _, text in items:
            yield (text[0], text[1]) if task.is_pair else (text, None)


def _read_dataset_dir(source: Path, task: Task) -> Iterator[Text]:
    try:
        import datasets
    except ImportError:
        raise UsageError(
            f"--transfer {source}: a directory is read as a saved 'datasets' data set; pip install "
            f"datasets (kdplug's glue extra), or pass a .tsv/.csv/.jsonl/.txt file"
        ) from None
    try:
        loaded = datasets.load_from_disk(str(source))
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(f"--transfer {source}: not a directory that datasets' save_to_disk wrote ({exc})") from None
    splits = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
    wanted = 2 if task.is_pair else 1
    for split in splits:
        columns = next(
            (
                list(c[:wanted])
                for c in (text_columns(task), ("text", "text_pair"))
                if all(name in split.column_names for name in c[:wanted])
            ),
            None,
        )
        if columns is None:
            raise UsageError(
                f"--transfer {source}: columns {', '.join(split.column_names)} hold none of the task's "
                f"text columns {', '.join(text_columns(task)[:wanted])} (or text/text_pair)"
            )
        for row in split.select_columns(columns).iter(batch_size=1000):
            for values in zip(*(row[c] for c in columns)):
                yield (values[0], values[1] if task.is_pair else None)


def transfer_key(
    config: RunConfig, task: Task, train: Sequence[Example], dev_keys: set[str], seed: int, teacher: Teacher
) -> str:
    """The set's fingerprint: its sources, the augmenter and its settings, the training and dev
    sentences (both are dropped from it) and the teacher (its outputs label the set, its special
    tokens decide what is degenerate)."""
    files = [
        fingerprint.of_file(str(p)) if Path(p).is_file() else _dir_fingerprint(Path(p))
        for p in (Path(path).expanduser() for path in config.transfer)
    ]
    augment = None
    if config.augment:
        augment = {
            "name": config.augment,
            "options": config.augment_options,
            "factor": augment_factor(config, task),
            "seed": seed,
        }
    teacher_key = (fingerprint.of_module(teacher.model), fingerprint.of_tokenizer(teacher.tokenizer))
    train_key = fingerprint.of_values([(e.text_a, e.text_b) for e in train])
    return fingerprint.of_values(
        "transfer", FORMAT_VERSION, task.name, task.is_pair, files, augment, teacher_key, train_key, sorted(dev_keys)
    )


def _dir_fingerprint(directory: Path) -> str:
    hasher = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        hasher.update(str(path.relative_to(directory)).encode())
        hasher.update(fingerprint.of_file(str(path)).encode())
    return hasher.hexdigest()


def build_or_load(
    config: RunConfig,
    registry: Registry,
    task: Task,
    teacher: Teacher,
    train: Sequence[Example],
    dev: dict[str, Sequence[Example]],
    *,
    root: Path,
    seed: int,
    echo: Callable[[str], None] = print,
    processes: shares.Processes = shares.ONE_PROCESS,
) -> TransferSet:
    """The run's transfer set, from the store or built now (under a lock, so parallel runs build it
    once). Every process of a launch calls it: they share the augmenter's work, rank 0 writes."""
    dev_keys = {normalised((e.text_a, e.text_b)) for split in dev.values() for e in split}
    store = root / "transfer"
    # rank 0's key: a teacher whose head is drawn anew in each process differs
    key = transfer_key(config, task, train, dev_keys, seed, teacher) if processes.leads else ""
    existing: Optional[TransferSet] = None

    def check() -> dict[str, Any]:
        nonlocal existing
        existing = _stored(store / key)
        return {"key": key, "build": existing is None, "augment": bool(config.augment)}

    with shares.lead_or_follow(
        processes, "building the transfer set", locks=[store / f"{key}.lock"], check=check,
        staging=store / f"{key}.shares",
    ) as build:  # fmt: skip
        target = store / build.order["key"]
        if not processes.leads:
            if build.shared and build.order["augment"]:
                augmenter, checks = _augmenter_and_checks(config, registry, teacher, train, dev_keys)
                shared = augmenting.SharedAugmentation(build, augmenter, train, checks)
                shared.prepare()
                shared.copy_share(augment_factor(config, task), seed)
        elif existing is None:
            started = time.perf_counter()
            with atomic_directory(target, f"the transfer set {target}") as staging:
                meta = _write_texts(staging, config, registry, task, teacher, train, dev_keys, seed, build)
                meta["seconds"] = round(time.perf_counter() - started, 2)
                (staging / META_FILE).write_text(json.dumps(meta, indent=1))
    if not processes.leads:
        existing = _stored(target)
        if existing is None:
            raise shares.ShareFailed(0, shares.LEAD_STOPPED, "building the transfer set")
        return _nonempty(existing)
    if existing is not None:
        echo(f"transfer set: reusing {existing.directory} ({len(existing)} examples)")
        return _nonempty(existing)
    _nonempty(TransferSet(target, meta))
    shared_by = meta.get("computed_by") or []
    echo(
        f"transfer set: {meta['examples']} examples built in {meta['seconds']:.1f}s ({dropped(meta)})"
        + (
            f"; {len(shared_by)} processes augmented "
            + " + ".join(str(record["examples"]) for record in shared_by)
            + " training examples"
            if len(shared_by) > 1
            else ""
        )
        + f" -> {target}"
    )
    return TransferSet(target, meta)


def _nonempty(transfer_set: TransferSet) -> TransferSet:
    if len(transfer_set) == 0:
        raise UsageError(
            "the transfer set is empty: every text repeated a dev or training sentence or another text of "
            "the set, or held only stop words and mask tokens; check --transfer's files (or raise --augment-factor)"
        )
    return transfer_set


def _augmenter_and_checks(
    config: RunConfig, registry: Registry, teacher: Teacher, train: Sequence[Example], dev_keys: set[str]
) -> tuple[Any, augmenting.Checks]:
    special = list(getattr(teacher.tokenizer, "all_special_tokens", None) or [])
    augmenter = None
    if config.augment:
        augmenter = registry.create("augmenter", config.augment, teacher, **config.augment_options)
        if capabilities(AugmenterCapabilities, augmenter).mask_token:
            special.append(augmenter.mask_token)  # an augment_options.mask_token of its own is no word either
    return augmenter, augmenting.Checks(train, dev_keys, special)


def _write_texts(
    directory: Path,
    config: RunConfig,
    registry: Registry,
    task: Task,
    teacher: Teacher,
    train: Sequence[Example],
    dev_keys: set[str],
    seed: int,
    build: shares.Build,
) -> dict[str, Any]:
    """The set's texts: the files' first, then the augmented copies, made here or, with ``folder``,
    by every process of the launch, each its share."""
    augmenter, checks = _augmenter_and_checks(config, registry, teacher, train, dev_keys)
    factor = augment_factor(config, task) if augmenter is not None else None
    computed_by = []
    with open(directory / TEXTS_FILE, "w", encoding="utf-8") as handle:
        writer = augmenting.Writer(handle, directory)
        shared = None
        if build.shared and augmenter is not None:
            shared = augmenting.SharedAugmentation(build, augmenter, train, checks)
            shared.prepare()
            shared.copy_share(factor, seed)
        for path in config.transfer:
            writer.check_and_offer(checks, read_transfer_file(path, task), "from_files")
        if shared is not None:
            computed_by = shared.join_copies(writer)
        elif augmenter is not None:
            augmenting.prepare_alone(augmenter, train)
            writer.check_and_offer(checks, (text for _, text in augmented(augmenter, train, factor, seed)), "augmented")
        writer.finish()
    return {
        **writer.counts,
        "version": FORMAT_VERSION,
        "files": list(config.transfer),
        "augment": config.augment,
        "augment_factor": factor,
        "mask_token": capabilities(AugmenterCapabilities, augmenter).mask_token,
        "augment_options": config.augment_options,
        "seed": seed,
        "training_examples": len(train),
        **({"computed_by": computed_by} if computed_by else {}),
    }


def dropped(meta: dict[str, Any]) -> str:
    """What building the set dropped, in words."""
    parts = [
        (meta["dropped_dev_duplicates"], "dev duplicates"),
        (meta["dropped_train_duplicates"], "training duplicates"),
        (meta["dropped_repeats"], "repeats"),
        (meta["dropped_degenerate"], "degenerate"),
    ]
    return "dropped: " + ", ".join(f"{count} {what}" for count, what in parts)


def _stored(target: Path) -> Optional[TransferSet]:
    existing = complete_copy(target)
    if existing is None or verify(existing):
        return None
    return TransferSet(existing, json.loads((existing / META_FILE).read_text()))


def find_stored(
    config: RunConfig,
    task: Task,
    teacher: Teacher,
    train: Sequence[Example],
    dev: dict[str, Sequence[Example]],
    *,
    root: Path,
    seed: int,
) -> Optional[TransferSet]:
    """The run's transfer set if the store holds it already (nothing is built)."""
    dev_keys = {normalised((e.text_a, e.text_b)) for split in dev.values() for e in split}
    return _stored(root / "transfer" / transfer_key(config, task, train, dev_keys, seed, teacher))

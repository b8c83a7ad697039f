"""Content fingerprints: what makes a cached teacher, cache or head set reusable.

A fingerprint changes whenever the thing it describes changes (a weight, a token id, a
setting), so a stale artefact is never reused; it does not depend on file paths or times.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported where a module is hashed: `kdplug --help` does not load it
    from torch import nn


def hasher() -> hashlib._Hash:
    """The hash every fingerprint and checksum uses (blake2b, 16 bytes); fed with ``update``."""
    return hashlib.blake2b(digest_size=16)


def of_module(module: nn.Module) -> str:
    """Hash of every parameter and buffer (names, shapes, dtypes, values). A module sharded by a device
    map hashes as the same module on one device: its offloaded tensors (left on the meta device in
    the module) are read from where Accelerate keeps them, one at a time."""
    import torch

    digest = hasher()
    for name, tensor in sorted(module.state_dict().items()):
        tensor = (offloaded_tensor(module, name) if tensor.is_meta else tensor).detach().cpu().contiguous()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def offloaded_tensor(module: nn.Module, name: str) -> Any:
    """The tensor ``name`` (a parameter or buffer's dotted name) of ``module`` that Accelerate offloaded
    to the CPU or disk (the module holds it on the meta device), on the CPU: read through the hook
    of the submodule that holds it, as its forward would read it."""
    from accelerate.utils.modeling import align_module_device, has_offloaded_params

    path, _, attribute = name.rpartition(".")
    owner = module.get_submodule(path)
    holder = owner  # the hook that loads it sits on the tensor's module or one above it
    while not has_offloaded_params(holder) and path:
        path = path.rpartition(".")[0]
        holder = module.get_submodule(path)
    with align_module_device(holder, "cpu"):
        return getattr(owner, attribute).detach().cpu().clone()


def readable(module: nn.Module, tensor: Any) -> Any:
    """``tensor``, a parameter or buffer of ``module``, with its values: itself, or where Accelerate
    offloaded it (a teacher sharded by a device map), read from there onto the CPU."""
    if not tensor.is_meta:
        return tensor
    named = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return offloaded_tensor(module, next(name for name, candidate in named if candidate is tensor))


def of_teacher_model(module: nn.Module) -> str:
    """A teacher's part of the keys of its cached outputs: its weights and buffers
    (:func:`of_module`), and its padding token's id, which moves the position a decoder is read at
    (its classifier, and kdplug's extractor, read the last token that is not padding) without
    being a weight."""
    config = getattr(module, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return of_values("teacher", of_module(module), getattr(text_config, "pad_token_id", None))


def of_tokenizer(tokenizer: Any) -> str:
    """Hash of the vocabulary and the settings that change token ids."""
    digest = hasher()
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    digest.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    for attribute in ("do_lower_case", "model_max_length", "padding_side", "truncation_side"):
        digest.update(f"{attribute}={getattr(tokenizer, attribute, None)}".encode())
    digest.update(type(tokenizer).__name__.encode())
    formatting = getattr(tokenizer, "kdplug_fingerprint", None)  # an encoder that formats the text (a prompt)
    if formatting is not None:
        digest.update(str(formatting).encode())
    return digest.hexdigest()


def of_token_ids(sequences: Iterable[Iterable[int]]) -> str:
    digest = hasher()
    for ids in sequences:
        digest.update(json.dumps(list(ids)).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def of_examples(splits: dict[str, Iterable[Any]]) -> str:
    """Hash of a data set's examples, split by split (texts and labels), read one at a time."""
    digest = hasher()
    for name in sorted(splits):
        digest.update(f"split {name}\n".encode())
        for example in splits[name]:
            record = [example.text_a, example.text_b, example.label]
            digest.update(json.dumps(record, ensure_ascii=False, default=str).encode() + b"\n")
    return digest.hexdigest()


def of_values(*values: Any) -> str:
    """Hash of JSON-serialisable settings."""
    return hashlib.blake2b(json.dumps(values, sort_keys=True, default=str).encode(), digest_size=16).hexdigest()


def of_file(path: str, chunk: int = 1 << 22) -> str:
    digest = hasher()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()

"""``teacher_options.device_map``: a teacher sharded over the devices of one machine, with CPU or disk
offload (Accelerate's big-model loading), for the teacher pass.

The options are checked before anything loads (:func:`placement_options`); with the checkpoint's
config, :func:`plan_placement` resolves ``auto`` (or ``balanced``, ``sequential``) into an explicit
map on a model with empty weights (no weights read), as transformers would, and that explicit map
is what the weights load with: the dry run says where the layers go, and the run puts them there.

Disk offload: transformers reads the offloaded weights of a safetensors checkpoint from the
checkpoint itself and writes nothing; where it must write them (other formats, weights converted
on load), it writes into a folder kdplug creates for this load inside ``offload_folder``
(``kdplug-offload-XXXX``) and removes when the teacher is released or the process ends. The
user's folder and whatever else is in it are left as they are.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import nn

from kdplug.errors import UsageError

#: the options of an in-process teacher that place it (:func:`placement_options`)
PLACEMENT_OPTIONS = ("device_map", "max_memory", "offload_folder")
#: the strategies Accelerate and transformers take for ``device_map``
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")

DeviceMapOption = Optional[Union[str, dict[str, Union[int, str]]]]
#: its sizes checked one by one (:func:`_max_memory`), to name the bad one
MaxMemoryOption = Optional[dict[Any, Any]]

#: the devices kdplug places on (Accelerate knows more, which kdplug does not run a teacher on)
_DEVICE = re.compile(r"(cpu|disk|cuda(:\d+)?|\d+)")
#: the file in each kdplug-offload-* folder naming the process that owns it: a folder whose owner died
#: (SIGKILL, a crash) is removed by the next load that offloads into the same offload_folder
OWNER_FILE = "kdplug-owner.pid"
log = logging.getLogger(__name__)
_SIZE_HELP = 'a size such as "20GiB", "500MB" or "300KiB", or a whole number of bytes (0 or more)'


@dataclass(frozen=True)
class PlacementOptions:
    """The placement options as given, checked: ``device_map`` a strategy or a map {module: device}."""

    device_map: Union[str, dict[str, Union[int, str]]]
    #: {device: bytes}, GPU indices as numbers
    max_memory: Optional[dict[Union[int, str], int]] = None
    offload_folder: Optional[str] = None


def placement_options(
    device_map: DeviceMapOption, max_memory: MaxMemoryOption, offload_folder: Optional[str]
) -> Optional[PlacementOptions]:
    """The placement the options ask for (None: one device, as without them), refused with the fix
    where a value cannot work: before any weights load."""
    if max_memory == {}:  # no limit named: as unset (Accelerate would take it as no memory anywhere)
        max_memory = None
    if device_map is None:
        given = [name for name, value in (("max_memory", max_memory), ("offload_folder", offload_folder)) if value]
        if given:
            raise UsageError(
                f"teacher_options.{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for a teacher sharded by "
                f"a device map: add --set teacher_options.device_map=auto (or a map {{module: device}}), or drop it"
            )
        return None
    processes = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if processes > 1:  # each process would load the whole teacher over every GPU
        raise UsageError(
            f"teacher_options.device_map shards the teacher over this machine's devices from one process, and this "
            f"launch has {processes} (WORLD_SIZE): run it as one process (kdplug run, without torchrun or "
            f"accelerate launch), which uses every GPU the map names"
        )
    if isinstance(device_map, str) and device_map not in STRATEGIES:
        raise UsageError(
            f"teacher_options.device_map must be one of {', '.join(STRATEGIES)} or a map {{module name: device}} "
            f"(devices: a GPU index, cuda:N, cpu or disk); got {device_map!r}"
        )
    if isinstance(device_map, dict):
        if not device_map:
            raise UsageError("teacher_options.device_map is an empty map: name modules and their devices, or use auto")
        for module, device in device_map.items():
            _check_device(device, f"teacher_options.device_map[{module!r}]")
        _check_no_overlap(device_map)
        if max_memory:
            raise UsageError(
                "teacher_options.max_memory limits what device_map auto, balanced, balanced_low_0 or sequential put "
                "on each device, and a map {module: device} places every module itself: drop max_memory, or use "
                "device_map=auto"
            )
    folder = _offload_folder(offload_folder)
    return PlacementOptions(device_map, _max_memory(max_memory), folder)


def _check_no_overlap(device_map: dict[str, Any]) -> None:
    """A module named inside another the map names would be placed twice (Accelerate takes one of them)."""
    keys = sorted(map(str, device_map))
    for outer in keys:
        inner = next((key for key in keys if key != outer and (outer == "" or key.startswith(outer + "."))), None)
        if inner is not None:
            raise UsageError(
                f"teacher_options.device_map names {inner!r} inside {outer!r}, which it also places: name each "
                f"module once, either {outer!r} (all of it on one device) or the modules inside it, each on its own"
            )


def _check_device(device: Any, where: str) -> None:
    if isinstance(device, bool) or not _DEVICE.fullmatch(str(device)):
        raise UsageError(f"{where} must be a GPU index (0, 1 ...), cuda:N, cpu or disk; got {device!r}")
    index = _cuda_index(device)
    if index is not None and index >= torch.cuda.device_count():
        have = torch.cuda.device_count()
        raise UsageError(
            f"{where} names GPU {index}, and this machine has {have or 'no'} CUDA GPU{'s' * (have != 1)}"
            f"{f' (0 to {have - 1})' if have else ''}: name a device it has (cpu, disk)"
        )


def _cuda_index(device: Any) -> Optional[int]:
    text = str(device)
    if text.isdigit():
        return int(text)
    if text.startswith("cuda"):
        return int(text.partition(":")[2] or 0)
    return None


def _max_memory(max_memory: MaxMemoryOption) -> Optional[dict[Union[int, str], int]]:
    """``max_memory`` with its sizes in bytes and its GPUs as indices, as Accelerate takes it."""
    if max_memory is None:
        return None
    from accelerate.utils import convert_file_size_to_int

    limits: dict[Union[int, str], int] = {}
    for device, size in max_memory.items():
        where = f"teacher_options.max_memory[{device!r}]"
        _check_device(device, f"a key of teacher_options.max_memory ({device!r})")
        if str(device) == "disk":
            raise UsageError(f"{where}: disk takes no limit (it holds what the other devices do not); drop it")
        limit = _bytes(size, convert_file_size_to_int)
        if limit < 0:
            raise UsageError(f"{where} must be {_SIZE_HELP}; got {size!r}")
        index = _cuda_index(device)  # Accelerate names GPUs by their index
        limits[index if index is not None else str(device)] = limit
    return limits


def _bytes(size: Any, convert: Any) -> int:
    """``size`` in bytes, -1 where it is not one: a whole number (given as a number or as text) or text with a unit."""
    if isinstance(size, bool) or not isinstance(size, (int, str)):
        return -1
    if isinstance(size, str) and size.strip().isdigit():
        return int(size)
    try:
        return convert(size)
    except (ValueError, TypeError, AttributeError):
        return -1


def _offload_folder(folder: Optional[str]) -> Optional[str]:
    """The folder offloaded weights may be written in (created when a load writes there): a file, or
    a folder kdplug could not create or write in, is refused before any weights load."""
    if folder is None:
        return None
    path = os.path.abspath(os.path.expanduser(str(folder)))
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(
            f"teacher_options.offload_folder {path} is a file, not a folder: name a folder (kdplug creates it) "
            f"where offloaded weights may be written"
        )
    existing = path
    while not os.path.exists(existing):  # the folder, or the nearest one above it that exists
        if os.path.islink(existing):
            raise UsageError(
                f"teacher_options.offload_folder {path} cannot be created: {existing} is a broken symbolic link "
                f"(to {os.readlink(existing)}): fix or remove the link, or name another folder"
            )
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"teacher_options.offload_folder {path} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK) or not _can_create_in(existing):
        raise UsageError(f"teacher_options.offload_folder {path}: {existing} is not writable; name a folder you can")
    return path


def _can_create_in(folder: str) -> bool:
    """Whether a folder can be made in ``folder`` (root passes os.access where the file system refuses,
    /proc): a probe kdplug makes and removes."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kdplug-probe-", dir=folder))
    except OSError:
        return False
    return True


@dataclass
class Placement:
    """Where a teacher's modules go: the explicit map it loads with, and what the run says of it."""

    device_map: dict[str, Union[int, str]]
    #: "teacher: 0.4 MiB in float32; device_map auto: layers 0-1 on cpu, 2-3 on disk; ..."
    line: str
    #: the device its inputs go to: its first module's where that is a GPU, as Accelerate's hooks
    #: expect (the main device, where offloaded modules run too)
    first_device: str
    offload_folder: Optional[str] = None
    #: the folder this load writes offloaded weights in (kdplug's, inside offload_folder)
    _written: Optional[str] = field(default=None, repr=False)

    def load_options(self) -> dict[str, Any]:
        """``from_pretrained``'s options for this placement."""
        options: dict[str, Any] = {"device_map": self.device_map}
        if "disk" in self.device_map.values():
            os.makedirs(self.offload_folder, exist_ok=True)
            remove_orphans(self.offload_folder)
            self._written = tempfile.mkdtemp(prefix="kdplug-offload-", dir=self.offload_folder)
            with open(os.path.join(self._written, OWNER_FILE), "w") as owner:
                owner.write(f"{os.getpid()}\n")
            options["offload_folder"] = self._written
        return options

    def discard(self) -> None:
        """Remove kdplug's offload folder of a load that failed (nothing will release it)."""
        if self._written is not None:
            shutil.rmtree(self._written, ignore_errors=True)
            self._written = None

    def release_with(self, model: nn.Module) -> None:
        """Remove kdplug's offload folder now where the load wrote nothing in it (a safetensors
        checkpoint's offloaded weights are read where they are), else when ``model`` is released or
        the process ends."""
        if self._written is None:
            return
        if os.listdir(self._written) == [OWNER_FILE]:  # nothing written
            shutil.rmtree(self._written, ignore_errors=True)
        else:
            weakref.finalize(model, shutil.rmtree, self._written, True)


def load_placed(placed: Optional[Placement], load: Callable[..., nn.Module]) -> nn.Module:
    """``load(**options)`` with ``placed``'s load options (none where unplaced): kdplug's offload folder
    removed if the load raises, else released with the model it returns."""
    if placed is None:
        return load()
    try:
        model = load(**placed.load_options())
    except BaseException:
        placed.discard()
        raise
    placed.release_with(model)
    return model


def remove_orphans(folder: str) -> None:
    """Remove the kdplug-offload-* folders in ``folder`` whose owner (its pid in :data:`OWNER_FILE`)
    is no longer alive: a process killed before it could. Only folders with that file, kdplug's."""
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.startswith("kdplug-offload-") or os.path.islink(path) or not os.path.isdir(path):
            continue
        owner = _owner(os.path.join(path, OWNER_FILE))
        if owner is not None and not _alive(owner):
            shutil.rmtree(path, ignore_errors=True)
            log.warning(
                "removed %s: offloaded weights of a kdplug run (process %d) that ended without removing them",
                path,
                owner,
            )


def _owner(marker: str) -> Optional[int]:
    try:
        with open(marker) as file:
            return int(file.read().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def plan_placement(
    options: PlacementOptions, build: Any, config: Any, dtype: Optional[torch.dtype], *, keep_head: bool = False
) -> Placement:
    """Resolve ``options`` on the model ``build(config)`` gives (a ``from_config``), its weights
    empty (nothing read): the map the weights load with. ``keep_head``: the classification head stays on the first
    device where the map would offload it (kdplug may put its rows in the task's label order)."""
    from accelerate import init_empty_weights
    from accelerate.utils import compute_module_sizes, get_balanced_memory, get_max_memory, infer_auto_device_map

    with init_empty_weights():
        model = build(config, **({"dtype": dtype} if dtype is not None else {}))
    no_split = getattr(model, "_no_split_modules", None) or []
    if isinstance(options.device_map, str):
        if options.device_map == "sequential":
            memory = get_max_memory(options.max_memory)
        else:
            memory = get_balanced_memory(
                model,
                max_memory=options.max_memory,
                no_split_module_classes=no_split,
                low_zero=options.device_map == "balanced_low_0",
            )
        device_map = dict(infer_auto_device_map(model, max_memory=memory, no_split_module_classes=no_split))
    else:
        device_map = _checked_map(model, options.device_map)
    if keep_head:
        device_map = _head_kept(model, device_map)
    if "disk" in device_map.values() and options.offload_folder is None:
        raise UsageError(
            f"teacher_options.device_map {_asked(options)} puts some of the teacher's modules on disk "
            f"({', '.join(name for name, device in device_map.items() if device == 'disk')}): name a folder they may "
            f"be written in, --set teacher_options.offload_folder=DIR, or allow more memory (max_memory)"
        )
    size = compute_module_sizes(model)[""]
    dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
    line = f"teacher: {_size(size)} in {dtype_name}; device_map {_asked(options)}: {describe(model, device_map)}"
    return Placement(device_map, line, _main_device(device_map), options.offload_folder)


def _asked(options: PlacementOptions) -> str:
    return options.device_map if isinstance(options.device_map, str) else "(a map)"


def _checked_map(model: nn.Module, device_map: dict[str, Union[int, str]]) -> dict[str, Union[int, str]]:
    """The user's map, each name a module of the model, every parameter covered by one."""
    modules = dict(model.named_modules())
    unknown = [name for name in device_map if name not in modules]
    if unknown:
        tops = ", ".join(name for name, _ in model.named_children())
        raise UsageError(
            f"teacher_options.device_map names {', '.join(map(repr, unknown))}, which the teacher "
            f"({type(model).__name__}) has no module called; its top-level modules are {tops} (a map names "
            f"modules by their dotted names, e.g. {next(iter(_blocks(model)), ('model.layers.0',))[0]!r})"
        )
    uncovered = sorted(
        {_unplaced_top(device_map, name) for name, _ in model.named_parameters() if _entry(device_map, name) is None}
    )
    if uncovered:
        shown = ", ".join(uncovered[:5]) + (f" and {len(uncovered) - 5} more" if len(uncovered) > 5 else "")
        raise UsageError(
            f"teacher_options.device_map places no device for {shown}: name every module (or a module above it), "
            f"or use device_map=auto"
        )
    return {name: device_map[name] for name in modules if name in device_map}  # in the model's order


def _unplaced_top(device_map: dict[str, Any], name: str) -> str:
    """The outermost module above the parameter ``name`` of which the map places nothing."""
    parts = name.split(".")
    for depth in range(1, len(parts)):
        prefix = ".".join(parts[:depth])
        if not any(key == prefix or key.startswith(prefix + ".") for key in device_map):
            return prefix
    return name


def _entry(device_map: dict[str, Any], name: str) -> Optional[str]:
    """The key of ``device_map`` that places the parameter or module ``name`` (its longest prefix)."""
    found = [key for key in device_map if key == "" or name == key or name.startswith(key + ".")]
    return max(found, key=len) if found else None


def _head_kept(model: nn.Module, device_map: dict[str, Union[int, str]]) -> dict[str, Union[int, str]]:
    """The modules outside the base model (the classification head) on the main device where the
    map offloads them: their weights must be real tensors to be reordered."""
    prefix = getattr(model, "base_model_prefix", "")
    if "" in device_map:  # one device for everything: name the top-level modules instead
        device_map = {name: device_map[""] for name, _ in model.named_children()}
    main = _main_device(device_map)
    offloaded = ("disk",) if main == "cpu" else ("disk", "cpu")
    kept = dict(device_map)
    for key, device in device_map.items():
        if key != prefix and not key.startswith(prefix + ".") and str(device) in offloaded:
            kept[key] = main
    return kept


def _main_device(device_map: dict[str, Union[int, str]]) -> str:
    """Where Accelerate runs the model (its offloaded modules too): the first device that is neither
    the CPU nor disk, else the CPU."""
    return next((_device_name(d) for d in device_map.values() if str(d) not in ("cpu", "disk")), "cpu")


def _device_name(device: Union[int, str]) -> str:
    return f"cuda:{device}" if isinstance(device, int) or str(device).isdigit() else str(device)


def _size(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return ""


def _blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's Transformer blocks: the children of its largest ModuleList."""
    lists = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.ModuleList)]
    if not lists:
        return []
    name, blocks = max(lists, key=lambda item: len(item[1]))
    return [(f"{name}.{index}", block) for index, block in enumerate(blocks)]


def _block_device(device_map: dict[str, Union[int, str]], block: str) -> str:
    """Where ``block`` goes: its entry's device, or the devices of its parts where the map splits it."""
    key = _entry(device_map, block)
    if key is not None:
        return _device_name(device_map[key])
    return "+".join(sorted({_device_name(d) for k, d in device_map.items() if k.startswith(block + ".")}))


def describe(model: nn.Module, device_map: dict[str, Union[int, str]]) -> str:
    """Where the layers go, ``layers 0-11 on cuda:0, 12-23 on cuda:1``, then the other modules."""
    blocks = [name for name, _ in _blocks(model)]
    runs: list[list[Any]] = []  # [first, last, device]
    for index, name in enumerate(blocks):
        device = _block_device(device_map, name)
        if runs and runs[-1][2] == device:
            runs[-1][1] = index
        else:
            runs.append([index, index, device])
    parts = [f"{first}-{last} on {device}" if first != last else f"{first} on {device}" for first, last, device in runs]
    text = f"layers {', '.join(parts)}" if parts else ""
    inside = tuple(blocks)
    others: dict[str, list[str]] = {}
    for key, device in device_map.items():
        if key and not any(
            block == key or block.startswith(key + ".") or key.startswith(block + ".") for block in inside
        ):
            others.setdefault(_device_name(device), []).append(key)
    if others:
        listed = "; ".join(f"{', '.join(names)} on {device}" for device, names in others.items())
        text = f"{text}; {listed}" if text else listed
    return text

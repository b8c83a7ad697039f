"""The Hugging Face hub: reach it, or say at once that it cannot be reached.

``transformers``, ``datasets`` and ``huggingface_hub`` retry a dead network for about 25 seconds
before failing with messages about connection pools. Everything in kdplug that may touch the
hub (teachers and students by hub id, GLUE without ``--data-dir``, ``export --push-to-hub``)
asks here first, so an offline machine gets an :class:`~kdplug.errors.OfflineError` (exit 2)
within seconds that says what to do instead. Public: plugins use it for their own downloads.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import urllib.request
from typing import Any, Optional
from urllib.parse import urlsplit

from .errors import OfflineError, UsageError

TIMEOUT = 3.0  # seconds to wait for a TCP connection to the hub before calling it unreachable
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUTHY = {"1", "on", "yes", "true"}
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` (a mirror), else huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT


def offline_by_env() -> bool:
    """``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` is set: the hub is switched off on purpose."""
    flags = (os.environ.get(name, "") for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    return any(flag.strip().lower() in _TRUTHY for flag in flags)


def reachable(url: Optional[str] = None, timeout: float = TIMEOUT) -> bool:
    """Whether a TCP connection to ``url``'s host (default: the hub), or to its proxy, opens within
    ``timeout`` seconds. Name resolution ignores socket timeouts, hence the thread."""
    parts = urlsplit(url or endpoint())
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
        parts = urlsplit(proxy)
    address = (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80))
    opened = threading.Event()

    def connect() -> None:
        try:
            socket.create_connection(address, timeout=timeout).close()
            opened.set()
        except OSError:
            pass

    threading.Thread(target=connect, daemon=True).start()
    return opened.wait(timeout)


def unreachable_reason() -> Optional[str]:
    """Why the hub cannot be used now (switched off, or no connection), or None when it can."""
    if offline_by_env():
        return "the Hugging Face hub is switched off (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set)"
    if not reachable():
        return f"the Hugging Face hub ({endpoint()}) cannot be reached (this machine looks offline)"
    return None


def require(purpose: str, fix: str) -> None:
    """Raise :class:`OfflineError` ("cannot <purpose>: <why>; <fix>") unless the hub can be used."""
    reason = unreachable_reason()
    if reason is not None:
        raise OfflineError(f"cannot {purpose}: {reason}; {fix}")


def is_hub_id(name: str) -> bool:
    """``name`` has the shape of a hub id (``bert-base-uncased``, ``owner/name``), not of a path."""
    return bool(HUB_ID.fullmatch(name)) and not name.startswith((".", "/", "~")) and ".." not in name


def cached_file(repo_id: str, filename: str) -> Optional[str]:
    """The local path of ``filename`` of the hub model ``repo_id`` if the Hugging Face cache holds
    it, else None; never touches the network."""
    if not is_hub_id(repo_id):
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename)
    except ValueError:  # not a valid repo id after all
        return None
    return found if isinstance(found, str) else None


def cache_directory() -> str:
    """Where the Hugging Face cache is (``HF_HUB_CACHE``, ``HF_HOME``/hub, or ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def exists(repo_id: str) -> bool:
    """Whether the hub has a model ``repo_id``; True when the hub cannot tell (the load will say)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    try:
        return HfApi(endpoint=endpoint()).repo_exists(repo_id)
    except (HfHubHTTPError, OSError, ValueError):
        return True


def display_name(source: str) -> str:
    """How a model source appears in what kdplug writes for others (model cards, metrics): a hub
    id as it is; a local directory by its last component, never its absolute path, which would
    reveal the user's file system once the card is published."""
    if os.path.isdir(os.path.expanduser(source)) or os.path.isabs(source) or source.startswith(("~", ".")):
        return os.path.basename(os.path.normpath(os.path.expanduser(source))) or source
    return source


def load_pretrained(
    loader: Any,
    source: str,
    what: str,
    *,
    local_option: Optional[str] = None,
    trust_remote_code: bool = False,
    **kwargs: Any,
) -> Any:
    """``loader.from_pretrained(source, **kwargs)`` (an Auto class, a tokenizer ...), failing fast
    when ``source`` is a hub id that is neither in the local cache nor reachable.

    ``what`` names the thing in messages (``"teacher"``); ``local_option`` is how the user passes
    a local directory instead (default ``--set <what>_options.source=/path/to/dir``).
    ``trust_remote_code`` (the user's ``<what>_options.trust_remote_code``) is always passed on,
    true only for the boolean True (any value that is not a boolean is refused), false by default:
    left unset, transformers would ask on the terminal whether to run the
    checkpoint's code.
    """
    if not isinstance(trust_remote_code, bool):  # bool("no") is True: text must never let a checkpoint's code run
        raise UsageError(
            f"{what}_options.trust_remote_code must be true or false, got {trust_remote_code!r} "
            f"({type(trust_remote_code).__name__}): write true or false without quotes"
        )
    if trust_remote_code is not True:
        refuse_remote_code(source, what)
    try:
        return _load(loader, source, what, local_option, trust_remote_code=trust_remote_code is True, **kwargs)
    except ValueError as exc:  # transformers refuses code it was not allowed to run, for an uncached hub id
        if "trust_remote_code" not in str(exc):
            raise
        raise UsageError(remote_code_message(source, what)) from None


def _load(
    loader: Any, source: str, what: str, local_option: Optional[str], *, trust_remote_code: bool, **kwargs: Any
) -> Any:
    if os.path.isdir(source):
        try:
            return loader.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
        except (OSError, ValueError) as exc:  # ValueError: an empty folder, a config.json without model_type
            if "trust_remote_code" in str(exc):
                raise
            raise UsageError(
                f"{what} directory {source} is not a complete Hugging Face checkpoint "
                f"(config.json with its model_type, weights, tokenizer files): {exc}"
            ) from exc
    if not HUB_ID.fullmatch(source):
        raise UsageError(
            f"{what} source {source!r} is not an existing directory (nor a hub id such as owner/name); check the path"
        )
    try:
        return loader.from_pretrained(source, local_files_only=True, trust_remote_code=trust_remote_code, **kwargs)
    except OSError:
        pass  # not cached: the hub is the only place left
    reason = unreachable_reason()
    if reason is not None:
        how = local_option or f"--set {what}_options.source=/path/to/dir"
        raise OfflineError(
            f"cannot load {what} {source!r}: {reason}, and it is not in the local Hugging Face "
            f"cache. On a machine with network, download it (hf download {source} --local-dir "
            f"DIR), then pass the directory: {how}."
        )
    try:
        return loader.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    except OSError as exc:
        raise UsageError(f"cannot load {what} {source!r} from the Hugging Face hub: {exc}") from exc


def refuse_remote_code(source: str, what: str) -> None:
    """A checkpoint whose config.json asks for code of its own (``auto_map``) for a model type this
    process does not know is refused before anything of it is imported: that code would run with
    the user's rights. kdplug's own students (registered model types) load without it."""
    import json

    path = os.path.join(source, "config.json") if os.path.isdir(source) else None
    if path is None and HUB_ID.fullmatch(source):
        path = cached_file(source, "config.json")
    if path is None or not os.path.isfile(path):
        return
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
    except (OSError, ValueError):
        return  # transformers reports an unreadable config itself
    if not isinstance(config, dict) or not config.get("auto_map"):
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if config.get("model_type") in CONFIG_MAPPING:
        return  # a model type this process has code for: transformers uses it, not the checkpoint's
    raise UsageError(remote_code_message(source, what))


def remote_code_message(source: str, what: str) -> str:
    return (
        f"{what} {source} asks to run Python code of its own (auto_map in its config.json): kdplug does not run "
        f"a checkpoint's code unless you allow it. If you trust its author, pass --set "
        f"{what}_options.trust_remote_code=true (the code then runs with your rights); otherwise use a "
        f"checkpoint of a model type transformers knows"
    )

"""Where kdplug keeps what it stores, and how it writes it so that nothing is ever half-written.

Everything kdplug stores for reuse (fine-tuned teachers, teacher outputs, heads, assistants,
tokenizers) and every checkpoint is written the same way: into a staging directory next to the
target, checksummed, then renamed into place. A reader therefore sees the previous complete copy
or the new complete copy, never a mixture; a failed write (full disk, a file-size limit, a
read-only or forbidden directory) removes its staging directory, keeps the previous copy and
raises :class:`StorageError`, whose message says what happened and that nothing was lost.

Files follow the user's umask (``mkdtemp`` alone would make every stored directory private), so
a cache shared by a team through a group-writable directory works. This module is part of the
public plugin API (``kdplug.api``): plugins that store things use it too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Optional

from . import fingerprint
from .errors import KdplugError, UsageError
from .layout import CHECKSUMS_FILE

#: what a staging directory's name starts with; ``kdplug cache clear --stale`` looks for it
STAGING_PREFIX = ".staging-"
#: the whole name of a staging file or directory: the prefix, the name it builds (and, for a file, the
#: writer's pid), then the 8 random characters of ``tempfile``'s unique names
_STAGING_NAME = re.compile(rf"{re.escape(STAGING_PREFIX)}.+\.[a-z0-9_]{{8}}")
#: a staging file's whole name: ``.staging-<name>.<pid>.<random>`` (see :func:`staging_file`)
_STAGING_FILE = re.compile(rf"{re.escape(STAGING_PREFIX)}.+\.\d+\.[a-z0-9_]{{8}}")
#: the file kdplug writes into each staging directory it makes, with :data:`_STAGING_MARK` inside: a
#: folder named like one (``.staging-backup.20261127``) is a user's unless it holds this
STAGING_MARKER = ".kdplug-staging"
_STAGING_MARK = "a staging directory of kdplug's: it is renamed into place, or removed once stale\n"
#: what kdplug writes into each lock file of :func:`file_lock`: an empty ``notes.lock`` is a user's
LOCK_MARK = "a lock file of kdplug's\n"
#: the suffix of a damaged stored copy that was moved aside
DAMAGED_SUFFIX = ".damaged"
#: the previous copy while a new one is renamed into place (used if a kill leaves no other)
PREVIOUS_SUFFIX = ".previous"


class StorageError(KdplugError):
    """A write failed (disk full, file too large, no permission, read-only file system).

    The previous copy of what was being written is intact; exit code 1. ``how_to_continue``, when
    set, is the next step the message already names (e.g. resuming from the checkpoint kept).
    """

    def __init__(self, message: str, how_to_continue: Optional[str] = None) -> None:
        super().__init__(message)
        self.how_to_continue = how_to_continue


def default_cache_root() -> Path:
    """``$KDPLUG_CACHE``, else ``~/.cache/kdplug``."""
    return Path(os.environ.get("KDPLUG_CACHE") or Path.home() / ".cache" / "kdplug")


#: the cache directory of the run building components now (see :func:`cache_root`)
_building_under: list[Path] = []


def cache_root() -> Path:
    """Where a component keeps what it stores for reuse (the folders it declares in ``stores``): the
    cache directory of the run that is building it (``--cache-dir``, as the run's preflight checked
    it), else :func:`default_cache_root`. A factory reads it when it is called, never at import."""
    return _building_under[-1] if _building_under else default_cache_root()


@contextlib.contextmanager
def building_under(root: Path) -> Iterator[None]:
    """Components built inside the block store under ``root`` (:func:`cache_root`); the engine wraps
    every factory call of a run in it."""
    _building_under.append(Path(root))
    try:
        yield
    finally:
        _building_under.pop()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: Path) -> None:
    """Give ``path`` the permissions a plain ``mkdir`` or ``open`` would have given it."""
    mode = (0o777 if path.is_dir() else 0o666) & ~current_umask()
    os.chmod(path, mode)


def open_own_file(path: Path, what: str = "file", *, append: bool = True):
    """``path`` opened to read and write (created if missing, appended to with ``append``), never
    through a symbolic link: kdplug writes through no link it did not make (a link planted in its
    place would make it write a file elsewhere). A link or a directory in its place is a
    :class:`UsageError` naming it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if append else 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UsageError(
                f"the {what} {path} is a symbolic link (to {os.readlink(path)}); kdplug writes through no link it "
                f"did not make: remove the link, or choose another directory"
            ) from None
        if exc.errno == errno.EISDIR:
            raise UsageError(
                f"the {what} {path} is a directory; kdplug writes a file of that name there: move the directory "
                f"away, or choose another directory"
            ) from None
        raise
    return os.fdopen(descriptor, "a+" if append else "r+", encoding="utf-8")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (and DDP ranks) on one machine; waits for the holder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_own_file(path, "lock file") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if not os.fstat(handle.fileno()).st_size:  # marked as kdplug's, so that cleaning up knows it
                handle.write(LOCK_MARK)
                handle.flush()
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class WriterLock:
    """One writer for a directory: an exclusive lock that a process holds for as long as it writes
    there (a run, a sweep's results, a report), with who holds it written inside.

    The operating system releases the lock when its process dies, so a killed writer never leaves a
    stale lock behind; the file stays (removing a lock file another process may have opened would
    let two processes each hold "the" lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle = None

    def acquire(self, what: str, advice: str) -> WriterLock:
        """Take the lock without waiting; a :class:`UsageError` naming the process that holds it
        (``what`` is being written by it; ``advice``: what to do instead)."""
        handle = open_own_file(self.path, "lock file", append=False)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            handle.close()
            raise UsageError(f"{what} is being written by {describe_holder(holder)}; {advice}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "since": time.strftime("%H:%M:%S")}))
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    @staticmethod
    def holder(path: Path) -> Optional[str]:
        """Who holds the lock at ``path`` now, in words; None when no process does (or no file)."""
        try:  # never through a link: a link in the lock's place is no lock of kdplug's
            handle = os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), encoding="utf-8")
        except OSError:
            return None
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return describe_holder(handle.read().strip())
            fcntl.flock(handle, fcntl.LOCK_UN)
        return None


def describe_holder(record: str) -> str:
    """'kdplug process 1234 (on host, since 10:02:11)' from what :class:`WriterLock` wrote."""
    try:
        info = json.loads(record)
        return f"kdplug process {info['pid']} (on {info['host']}, since {info['since']})"
    except (ValueError, KeyError, TypeError):
        return "another kdplug process"


def check_directory_path(directory: Path, name: str, option: str = "--output") -> None:
    """Raise a :class:`UsageError` when ``directory`` cannot be a directory to write: a symbolic link
    to nothing, or a file (``name`` is what the message calls it)."""
    if directory.is_symlink() and not directory.exists():
        raise UsageError(
            f"{name} {directory} is a symbolic link to {os.readlink(directory)}, which does not exist; create "
            f"that directory or choose another {option}"
        )
    if directory.exists() and not directory.is_dir():
        raise UsageError(f"{name} {directory} exists and is not a directory; choose another {option}")


def check_own_directory(directory: Path, marker: str, *, writes: str, option: str = "--output") -> None:
    """Raise a :class:`UsageError` unless ``directory`` is new, empty, or marked by ``marker`` as one
    kdplug wrote: a command that ``writes`` files never replaces files of the same names of a user's.
    Its own lock files and staging files (a concurrent writer of the same command) do not count."""
    check_directory_path(directory, option, option)
    if not directory.is_dir() or (directory / marker).is_file():
        return
    foreign = sorted(
        entry.name
        for entry in directory.iterdir()
        if not entry.name.endswith(".lock") and not is_staging_name(entry.name)
    )
    if foreign:
        raise UsageError(
            f"{option} {directory} holds files kdplug did not write (e.g. {foreign[0]}); it writes {writes} only "
            f"into a new or empty directory, or one it wrote before (marked by {marker}): choose another {option}"
        )


# -- write failures ------------------------------------------------------------------------------

_REASONS = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EFBIG: "a file reached the size limit of this process (ulimit -f)",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
}
#: how libraries that do not raise OSError (safetensors, torch.save) spell the same failures
_MESSAGES = (
    ("no space left", errno.ENOSPC),
    ("code: 28", errno.ENOSPC),
    ("storagefull", errno.ENOSPC),
    ("file too large", errno.EFBIG),
    ("filetoolarge", errno.EFBIG),
    ("code: 27", errno.EFBIG),
    ("permission denied", errno.EACCES),
    ("read-only file system", errno.EROFS),
    ("file write failed", errno.EIO),
    ("ioerror", errno.EIO),
)


def write_failure_reason(exc: BaseException) -> Optional[str]:
    """What went wrong when ``exc`` is a failed write, in words; None when it is something else."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return _REASONS.get(exc.errno, os.strerror(exc.errno).lower())
    text = str(exc).lower().replace(" ", "")
    for needle, code in _MESSAGES:
        if needle.replace(" ", "") in text:
            return _REASONS.get(code, f"a write failed ({exc})")
    if "inline_container" in text and "unexpectedpos" in text:  # torch.save's writer found its file cut short
        return "a file was cut short: the disk is full or a file-size limit (ulimit -f) was reached"
    return None


def raise_as_storage_error(exc: BaseException, what: str, kept: str, *, how_to_continue: Optional[str] = None) -> None:
    """Re-raise a failed write of ``what`` as a :class:`StorageError` saying ``kept`` (and
    ``how_to_continue``, when given, which the error then carries); other errors unchanged.

    A :class:`StorageError` from a write inside this one keeps its message and gains ``kept``.
    """
    step = f" {how_to_continue[0].upper()}{how_to_continue[1:]}." if how_to_continue else ""
    if isinstance(exc, StorageError):
        carried = how_to_continue or exc.how_to_continue
        raise StorageError(f"{str(exc).rstrip('.')}; {kept}.{step}", carried) from exc
    reason = write_failure_reason(exc)
    if reason is None:
        raise exc
    raise StorageError(f"could not write {what}: {reason}; {kept}.{step}", how_to_continue) from exc


def staging_file(path: Path) -> tuple[int, Path]:
    """A new, empty file beside ``path`` to write it in, opened (its descriptor) and named for this
    process alone: ``.staging-<name>.<pid>.<random>``, created exclusively (``O_EXCL``), so two
    writers of one file never share it and no file of a user's is ever opened or replaced in its
    place. The file has umask permissions; rename it onto ``path`` with ``os.replace``, which
    replaces a link at ``path`` rather than writing through it."""
    descriptor, name = tempfile.mkstemp(
        prefix=f"{STAGING_PREFIX}{Path(path).name}.{os.getpid()}.", dir=Path(path).parent
    )
    os.fchmod(descriptor, 0o666 & ~current_umask())
    return descriptor, Path(name)


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a part (text is UTF-8)."""
    path = Path(path)
    descriptor, staging = staging_file(path)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(content if isinstance(content, bytes) else content.encode("utf-8"))
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


# -- atomic directories --------------------------------------------------------------------------


def staging_directory(parent: Path, name: str) -> Path:
    """A fresh, empty directory in ``parent`` to build ``name`` in, with umask permissions."""
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{name}.", dir=parent))
    (staging / STAGING_MARKER).write_text(_STAGING_MARK, encoding="utf-8")  # in a folder only this process has
    follow_umask(staging)
    return staging


def unmark_staging(staging: Path) -> None:
    """Remove the marker of :func:`staging_directory`, before the folder is renamed into place."""
    (staging / STAGING_MARKER).unlink(missing_ok=True)


def is_kdplug_staging(path: Path) -> bool:
    """Whether ``path`` is a staging file or directory kdplug made (the one definition cleaning up uses):
    a directory of a staging name holding kdplug's marker, or a file named ``.staging-<name>.<pid>.<random>``.
    A user's ``.staging-backup.20261127`` is neither."""
    if path.is_symlink():
        return False
    if path.is_dir():
        marker = path / STAGING_MARKER
        return is_staging_name(path.name) and _holds(marker, _STAGING_MARK)
    return path.is_file() and _STAGING_FILE.fullmatch(path.name) is not None


def staging_target(name: str) -> Optional[str]:
    """The name a staging file or directory named ``name`` builds (``.staging-<name>.[<pid>.]<random>``), or
    None when ``name`` is no staging name."""
    if not is_staging_name(name):
        return None
    built = name.removeprefix(STAGING_PREFIX).rsplit(".", 1)[0]
    return built.rsplit(".", 1)[0] if _STAGING_FILE.fullmatch(name) else built


def staging_pid(path: Path, name: str) -> Optional[int]:
    """The process id in a staging file of ``name`` (``.staging-<name>.<pid>.<random>``, a plain file), else None."""
    prefix = f"{STAGING_PREFIX}{name}."
    if path.is_symlink() or not path.is_file() or not _STAGING_FILE.fullmatch(path.name):
        return None
    pid, _, random = path.name.removeprefix(prefix).partition(".") if path.name.startswith(prefix) else ("", "", "")
    return int(pid) if pid.isdigit() and len(random) == 8 else None


def is_kdplug_lock(path: Path) -> bool:
    """Whether ``path`` is a lock file :func:`file_lock` made (it holds kdplug's mark and nothing else)."""
    return path.name.endswith(".lock") and _holds(path, LOCK_MARK)


def _holds(path: Path, text: str) -> bool:
    if path.is_symlink() or not path.is_file() or path.stat().st_size != len(text.encode()):
        return False
    try:
        return path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def write_checksums(directory: Path) -> None:
    """Record a checksum of every file below ``directory`` (what :func:`verify` checks)."""
    sums = {
        str(path.relative_to(directory)): fingerprint.of_file(str(path))
        for path in sorted(directory.rglob("*"))
        if path.is_file() and path.name not in (CHECKSUMS_FILE, STAGING_MARKER)
    }
    (directory / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=1))


def recorded_checksums(directory: Path) -> Optional[dict[str, str]]:
    """The checksum of each file :func:`atomic_directory` wrote into ``directory``, by name; None
    when its checksum file is missing or unreadable."""
    try:
        sums = json.loads((directory / CHECKSUMS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return sums if isinstance(sums, dict) else None


def verify(directory: Path) -> list[str]:
    """Problems with a directory written by :func:`atomic_directory`: [] when it is intact."""
    if not (directory / CHECKSUMS_FILE).is_file():
        return [f"{CHECKSUMS_FILE} is missing"]
    sums = recorded_checksums(directory)
    if sums is None:
        return [f"{CHECKSUMS_FILE} is unreadable"]
    problems = []
    for name, expected in sums.items():
        file = directory / name
        if not file.is_file():
            problems.append(f"{name} is missing")
        elif fingerprint.of_file(str(file)) != expected:
            problems.append(f"{name} fails its checksum")
    return problems


def move_aside(directory: Path) -> Path:
    """Rename a damaged stored directory out of the way (kept for inspection, never deleted here)."""
    target = directory.with_name(f"{directory.name}{DAMAGED_SUFFIX}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(directory, target)
    return target


def replace_directory(staging: Path, target: Path, between: Optional[Callable[[], None]] = None) -> None:
    """Put ``staging`` in the place of ``target``: the old copy stays readable as
    ``<target>.previous`` until the new one is in place (see :func:`complete_copy`).
    ``between`` runs between the two renames (the robustness tests kill the process there)."""
    previous = target.with_name(target.name + PREVIOUS_SUFFIX)
    if target.is_symlink():
        raise UsageError(
            f"{target} is a symbolic link (to {os.readlink(target)}), which kdplug did not make and would replace; "
            f"remove the link, or choose another directory"
        )
    if target.exists() and not (target / CHECKSUMS_FILE).is_file() and _holds_any(target):
        raise UsageError(  # what is there would be moved aside and deleted: only a copy kdplug wrote may be
            f"{target} holds files kdplug did not write (it has no {CHECKSUMS_FILE}), and kdplug would replace it; "
            f"move it away, or choose another directory"
        )
    if previous.is_symlink() or (previous.exists() and not (previous / CHECKSUMS_FILE).is_file()):
        raise UsageError(
            f"{previous} is in the way: kdplug keeps the previous copy of {target} under that name while it puts the "
            f"new one in place, and it did not write what is there; move it away"
        )
    if target.exists():
        shutil.rmtree(previous, ignore_errors=True)
        os.replace(target, previous)
        if between is not None:
            between()
    unmark_staging(staging)
    os.replace(staging, target)
    shutil.rmtree(previous, ignore_errors=True)


def _holds_any(directory: Path) -> bool:
    return not directory.is_dir() or any(directory.iterdir())


def complete_copy(target: Path, is_complete=lambda path: not verify(path)) -> Optional[Path]:
    """``target`` if complete, else the previous copy a kill between two renames left behind."""
    for candidate in (target, target.with_name(target.name + PREVIOUS_SUFFIX)):
        if candidate.is_dir() and is_complete(candidate):
            return candidate
    return None


@contextlib.contextmanager
def atomic_directory(target: Path, what: str) -> Iterator[Path]:
    """Build ``target`` in a staging directory that becomes ``target`` when the block succeeds.

    On success the files are checksummed and the staging directory replaces ``target`` (the
    previous copy, if any, is removed only after). On any failure the staging directory is
    removed and ``target`` is untouched; a failed write becomes a :class:`StorageError`.
    """
    staging = staging_directory(target.parent, target.name)
    try:
        yield staging
        for path in staging.rglob("*"):  # libraries write some files private (transformers: 0600)
            follow_umask(path)
        write_checksums(staging)
        follow_umask(staging / CHECKSUMS_FILE)
        replace_directory(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        kept = (
            f"the previous copy {target} is intact"
            if target.exists()
            else "nothing was stored, and nothing else was changed"
        )
        raise_as_storage_error(exc, what, kept)
        raise


def is_staging_name(name: str) -> bool:
    """Whether ``name`` is one kdplug gives what it writes before renaming it into place (a user's
    file that merely starts with ``.staging-`` is not)."""
    return _STAGING_NAME.fullmatch(name) is not None


def stale_staging(root: Path) -> list[Path]:
    """Staging directories below ``root`` that no live write owns (left by killed processes).

    A staging directory is stale when no lock next to it is held; kdplug's writers hold their
    lock for as long as they write, so asking for the lock without waiting tells them apart.
    """
    found = []
    for path in sorted(root.rglob(f"{STAGING_PREFIX}*")) if root.is_dir() else []:
        if is_kdplug_staging(path) and not _in_use(path):
            found.append(path)
    return found


def _in_use(staging: Path, recent_seconds: float = 60.0) -> bool:
    # A write in progress touches its staging directory continually; one untouched for a minute
    # whose owner holds no lock in the same folder is left over from a killed process.
    if time.time() - staging.stat().st_mtime < recent_seconds:
        return True
    return any(WriterLock.holder(lock) is not None for lock in staging.parent.glob("*.lock"))

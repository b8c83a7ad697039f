"""``kdplug predict``: a trained student's predictions for the texts in a file (or stdin).

Input formats: TSV, CSV and JSONL with the task's input columns (``text`` / ``text_pair`` also
work), or plain lines of text (``.txt``; a sentence pair is two fields separated by a tab).
The output repeats each input row with the predicted label and every label's probability (a
``score`` for regression), in the input's format; plain lines come back as TSV.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import glob
import io
import itertools
import json
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ..errors import KdplugError, UsageError
from ..plugins import PluginManager
from ..progress import progress
from ..storage import STAGING_PREFIX, staging_file, staging_pid
from ..textio import FORMATS, input_format


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "predict",
        help="predict with a trained student on a file of texts",
        description="Load the student of a run (RUN_DIR or RUN_DIR/student, or an export of it) and write its "
        "predictions for every "
        "row of --input: the row, the predicted label and each label's probability (regression: "
        "score). Formats: .tsv, .csv, .jsonl with the task's text columns (or 'text'/'text_pair'), "
        "or .txt with one text per line (a pair: two tab-separated fields). '-' reads stdin / writes "
        "stdout. Texts longer than the student's maximum length are truncated as in training, and "
        "counted.",
        epilog="example:\n  kdplug predict runs/demo --input reviews.txt --output predictions.tsv\n"
        "  echo 'a gripping, moving film' | kdplug predict runs/demo --input -\n"
        "  kdplug predict deploy/demo-onnx --input reviews.txt --runtime onnx   # an ONNX export",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("student", metavar="RUN_DIR|STUDENT_DIR", help="a run directory or its student/ directory")
    parser.add_argument("--input", required=True, help="file of texts (.tsv, .csv, .jsonl, .txt) or - for stdin")
    parser.add_argument("--output", default="-", help="where to write (default: stdout); format from the extension")
    parser.add_argument(
        "--format",
        choices=sorted(set(FORMATS.values())),
        help="input format when the extension does not say (stdin: lines)",
    )
    parser.add_argument("--text-column", help="the input column with the text (default: the task's)")
    parser.add_argument("--pair-column", help="the input column with the second text of a pair")
    parser.add_argument("--encoding", help="the input's encoding when not UTF-8 (e.g. latin-1, cp1252)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--tokens-per-batch",
        type=int,
        metavar="N",
        help="batches of at most N padded tokens, texts sorted by length (docs/performance.md), instead of "
        "--batch-size texts in their order; the output keeps the input's order",
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument(
        "--runtime",
        choices=["auto", "torch", "onnx"],
        default="auto",
        help="torch (the package's weights) or onnx (an ONNX export's model.onnx through ONNX Runtime); "
        "auto (default): onnx for an ONNX export directory, else torch",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip checking the package against its checksums (for a package you changed on purpose)",
    )
    parser.set_defaults(handler=handle)


#: rows read, predicted and written at a time: memory stays flat whatever the input's length
CHUNK_ROWS = 4096


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from .. import textio
    from ..inference import load_student

    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.tokens_per_batch is not None and args.tokens_per_batch < 1:
        raise UsageError(
            f"--tokens-per-batch must be at least 1 (padded tokens per batch), got {args.tokens_per_batch}"
        )
    if args.output != "-":
        check_output_file(Path(args.output), args.overwrite)  # before the student loads and predicts
    fmt = input_format(args.input, args.format)
    if args.input != "-" and not Path(args.input).is_file():
        raise UsageError(f"--input {args.input} does not exist")
    student = load_student(args.student, device=args.device, runtime=args.runtime, verify=not args.no_verify)
    name = "<stdin>" if args.input == "-" else args.input
    columns = (args.text_column, args.pair_column) if args.text_column else None
    with contextlib.ExitStack() as stack:
        stream, keys = _open_input(args, fmt, name, stack)
        keys, items = textio.input_rows(stream, fmt, name, student.text_columns, student.is_pair, columns, keys=keys)
        count, truncated = _write_predictions(student, keys, items, args, output_format(args.output, fmt))
    where = "stdout" if args.output == "-" else args.output
    print(
        f"{count} predictions written to {where}"
        + (f"; {truncated} longer than the student's {student.max_length} tokens were truncated" if truncated else ""),
        file=sys.stderr,
    )
    return 0


def _open_input(args: argparse.Namespace, fmt: str, name: str, stack: contextlib.ExitStack):
    """The input as a text stream read as it goes, and a JSONL file's keys (read in a first pass)."""
    from .. import textio

    if args.input == "-":  # read whole: a pipe cannot be read twice (a JSONL file's keys, then its rows)
        text = textio.decode(sys.stdin.buffer.read(), name, encoding=args.encoding, option="--encoding")
        return io.StringIO(text), None

    def opened():
        return stack.enter_context(textio.open_text(args.input, encoding=args.encoding, option="--encoding"))

    return opened(), (textio.jsonl_keys(opened(), name) if fmt == "jsonl" else None)


def _write_predictions(
    student, keys: list[str], items: Iterable, args: argparse.Namespace, fmt: str
) -> tuple[int, int]:
    """The predictions of every item, written chunk by chunk; how many, and how many were truncated."""
    count, truncated = 0, 0
    with open_output(args.output) as out:
        out.write(header(keys, student.labels, fmt))
        bar = progress(desc="predict", unit="text")
        items = iter(items)
        while chunk := list(itertools.islice(items, CHUNK_ROWS)):
            predictions = student.predict(
                [text for _, text in chunk], batch_size=args.batch_size, tokens_per_batch=args.tokens_per_batch
            )
            out.write(render([row for row, _ in chunk], keys, predictions, student.labels, fmt))
            count += len(predictions)
            truncated += sum(p.truncated for p in predictions)
            bar.update(len(predictions))
        bar.close()
    return count, truncated


def output_format(path: str, input_fmt: str) -> str:
    if path != "-":
        fmt = FORMATS.get(os.path.splitext(path)[1].lower())
        if fmt is not None and fmt != "lines":
            return fmt
    return "tsv" if input_fmt == "lines" else input_fmt


def header(keys: list[str], labels: tuple[str, ...], fmt: str) -> str:
    if fmt == "jsonl":
        return ""
    added = ["score"] if not labels else ["label"] + [f"probability_{label}" for label in labels]
    return _table_lines([keys + added], fmt)


def render(rows: list[dict], keys: list[str], predictions: list, labels: tuple[str, ...], fmt: str) -> str:
    """The output lines of ``rows`` and their predictions (the header apart: :func:`header`)."""
    if fmt == "jsonl":
        return "".join(
            json.dumps({**row, **prediction.as_dict()}, ensure_ascii=False) + "\n"
            for row, prediction in zip(rows, predictions)
        )
    lines = []
    for row, prediction in zip(rows, predictions):
        values: list[Any] = [row.get(key, "") for key in keys]
        if prediction.score is not None:
            values.append(f"{prediction.score:.6g}")
        else:
            values += [prediction.label] + [f"{prediction.probabilities[label]:.6f}" for label in labels]
        lines.append(values)
    return _table_lines(lines, fmt)


def _table_lines(lines: list[list[Any]], fmt: str) -> str:
    """Rows as Python's csv module (and pandas, and spreadsheets) read them back to the same texts: a
    field holding the delimiter, a quote or a line break is quoted, its quotes doubled; a backslash
    is an ordinary character. TSV too: a text with a tab or a line break cannot be written otherwise."""
    # The writer quotes a lone "\r" only when its line terminator holds one, and readers end a row at
    # it: so rows are written ending "\r\n" (every "\r" in a field quoted), then end in "\n" alone.
    buffer = io.StringIO()
    writer = csv.writer(
        buffer, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL
    )
    rows = []
    for values in lines:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(values)
        rows.append(buffer.getvalue()[:-2] + "\n")
    return "".join(rows)


@contextlib.contextmanager
def open_output(path: str) -> Iterator[TextIO]:
    """stdout, or a staging file beside ``path`` renamed into place once every row is written:
    nothing half-written, and a previous file unchanged, whatever stops the command."""
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(path)
    name_left_staging(target)
    # SIGTERM ends a process without unwinding it: made an exit here, the staging file is removed below
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    staging = None
    try:
        with _writing(path):
            descriptor, staging = staging_file(target)  # this process's own: two commands never share one
            handle = open(descriptor, "w", encoding="utf-8", newline="")
        with handle:
            yield _Output(handle, path)  # an error of the block's own (reading --input, predicting) is not ours
            with _writing(path):
                handle.flush()
        with _writing(path):
            os.replace(staging, target)
    except BaseException:
        if staging is not None:
            staging.unlink(missing_ok=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def name_left_staging(target: Path) -> None:
    """Name the staging files of ``target`` that a killed ``kdplug predict`` left (their process has
    ended), with the command that removes them. kdplug does not remove them itself: a process id
    alone does not prove the file is kdplug's, and a file it did not write is never deleted."""
    for path in sorted(target.parent.glob(f"{glob.escape(STAGING_PREFIX + target.name)}.*")):
        pid = staging_pid(path, target.name)
        if pid is not None and not _running(pid):
            print(
                f"note: {path} was left by a kdplug predict that has ended (process {pid}); it is not used. "
                f"Remove it with: rm {shlex.quote(str(path))}",
                file=sys.stderr,
            )


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


@contextlib.contextmanager
def _writing(path: str) -> Iterator[None]:
    """A failed write of --output (disk full, file-size limit) as a message naming it."""
    try:
        yield
    except OSError as exc:
        raise KdplugError(
            f"writing --output {path} failed ({exc.strerror or exc}); nothing was written there (a previous file "
            f"is unchanged). Free space or choose another --output and run the command again"
        ) from None


class _Output:
    """The staging file, whose failed writes are --output's (and nothing else the block does)."""

    def __init__(self, handle: TextIO, path: str) -> None:
        self._handle, self._path = handle, path

    def write(self, text: str) -> int:
        with _writing(self._path):
            return self._handle.write(text)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # 143, as the shell reports a process SIGTERM stopped


def check_output_file(target: Path, overwrite: bool) -> None:
    """``--output`` can take the predictions: a file (new, or replaced with --overwrite) in a
    directory that accepts new files."""
    if target.is_dir():
        raise UsageError(f"--output {target} is a directory; name a file in it, e.g. {target / 'predictions.tsv'}")
    if (target.exists() or target.is_symlink()) and not overwrite:  # a dangling link is the user's too
        what = "exists" if target.exists() else "is a symbolic link (to nothing)"
        raise UsageError(f"--output {target} {what}; choose another file or pass --overwrite to replace it")
    if not target.parent.is_dir():
        what = "is a file, not a directory" if target.parent.exists() else "does not exist"
        raise UsageError(f"the directory of --output {target}, {target.parent}, {what}")
    try:
        with tempfile.TemporaryFile(dir=target.parent):
            pass
    except OSError as exc:
        raise UsageError(
            f"--output {target}: cannot write in {target.parent} ({(exc.strerror or str(exc)).lower()}); "
            f"choose another --output or fix the permissions"
        ) from None

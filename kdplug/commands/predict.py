"""``kdplug predict``: a trained student's predictions for the texts in a file (or stdin).

Input formats: TSV, CSV and JSONL with the task's input columns (``text`` / ``text_pair`` also
work), or plain lines of text (``.txt``; a sentence pair is two fields separated by a tab).
The output repeats each input row with the predicted label and every label's probability (a
``score`` for regression), in the input's format; plain lines come back as TSV.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

from ..errors import DataError, UsageError
from ..plugins import PluginManager
from ..storage import write_atomic

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".txt": "lines"}
GENERIC_COLUMNS = ("text", "text_pair")


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "predict", help="predict with a trained student on a file of texts",
        description="Load the student of a run (RUN_DIR or RUN_DIR/student) and write its predictions for every "
                    "row of --input: the row, the predicted label and each label's probability (regression: "
                    "score). Formats: .tsv, .csv, .jsonl with the task's text columns (or 'text'/'text_pair'), "
                    "or .txt with one text per line (a pair: two tab-separated fields). '-' reads stdin / writes "
                    "stdout. Texts longer than the student's maximum length are truncated as in training, and "
                    "counted.",
        epilog="example:\n  kdplug predict runs/demo --input reviews.txt --output predictions.tsv\n"
               "  echo 'a gripping, moving film' | kdplug predict runs/demo --input -",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("student", metavar="RUN_DIR|STUDENT_DIR", help="a run directory or its student/ directory")
    parser.add_argument("--input", required=True, help="file of texts (.tsv, .csv, .jsonl, .txt) or - for stdin")
    parser.add_argument("--output", default="-", help="where to write (default: stdout); format from the extension")
    parser.add_argument("--format", choices=sorted(set(FORMATS.values())),
                        help="input format when the extension does not say (stdin: lines)")
    parser.add_argument("--text-column", help="the input column with the text (default: the task's)")
    parser.add_argument("--pair-column", help="the input column with the second text of a pair")
    parser.add_argument("--encoding", help="the input's encoding when not UTF-8 (e.g. latin-1, cp1252)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda when available)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    from .. import textio
    from ..inference import load_student

    if args.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.output != "-" and Path(args.output).exists() and not args.overwrite:
        raise UsageError(f"--output {args.output} exists; choose another file or pass --overwrite to replace it")
    student = load_student(args.student, device=args.device)
    fmt = input_format(args.input, args.format)
    name = "<stdin>" if args.input == "-" else args.input
    if args.input == "-":
        text = textio.decode(sys.stdin.buffer.read(), name, encoding=args.encoding, option="--encoding")
    else:
        if not Path(args.input).is_file():
            raise UsageError(f"--input {args.input} does not exist")
        text = textio.read_text(args.input, encoding=args.encoding, option="--encoding")
    columns = (args.text_column, args.pair_column) if args.text_column else None
    rows, keys, texts = read_inputs(text, fmt, name, student.text_columns, student.is_pair, columns)
    predictions = student.predict(texts, batch_size=args.batch_size, progress=True)
    out_fmt = output_format(args.output, fmt)
    write(args.output, render(rows, keys, predictions, student.labels, out_fmt))
    truncated = sum(p.truncated for p in predictions)
    where = "stdout" if args.output == "-" else args.output
    print(f"{len(predictions)} predictions written to {where}" +
          (f"; {truncated} longer than the student's {student.max_length} tokens were truncated" if truncated else ""),
          file=sys.stderr)
    return 0


def input_format(path: str, given: Optional[str]) -> str:
    if given:
        return given
    if path == "-":
        return "lines"
    fmt = FORMATS.get(os.path.splitext(path)[1].lower())
    if fmt is None:
        raise UsageError(f"cannot tell the format of {path}: use .tsv, .csv, .jsonl or .txt, or pass --format")
    return fmt


def output_format(path: str, input_fmt: str) -> str:
    if path != "-":
        fmt = FORMATS.get(os.path.splitext(path)[1].lower())
        if fmt is not None and fmt != "lines":
            return fmt
    return "tsv" if input_fmt == "lines" else input_fmt


def pick_columns(header: list[str], task_columns: tuple[str, ...], is_pair: bool,
                 given: Optional[tuple[Optional[str], Optional[str]]], name: str) -> list[str]:
    """The input's text columns: given ones, else the task's, else text/text_pair."""
    wanted = 2 if is_pair else 1
    candidates = [tuple(c for c in given if c)] if given else [task_columns[:wanted], GENERIC_COLUMNS[:wanted]]
    for columns in candidates:
        if len(columns) == wanted and all(column in header for column in columns):
            return list(columns)
    expected = " and ".join(repr(c) for c in candidates[0]) + (
        f" (or {' and '.join(repr(c) for c in candidates[1])})" if len(candidates) > 1 else "")
    raise DataError(f"the input has columns {', '.join(repr(h) for h in header) or '(none)'} but this student reads "
                    f"{expected}; rename them, or name yours with --text-column"
                    f"{' and --pair-column' if is_pair else ''}", path=name, line=1)


def read_inputs(text: str, fmt: str, name: str, task_columns: tuple[str, ...], is_pair: bool,
                given: Optional[tuple[Optional[str], Optional[str]]]) -> tuple[list[dict], list[str], list]:
    """(rows as dicts, the row keys in order, the texts or pairs to predict)."""
    if fmt == "lines":
        rows, texts = [], []
        keys = list(GENERIC_COLUMNS[:2 if is_pair else 1])
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            fields = line.split("\t")
            if is_pair and len(fields) != 2:
                raise DataError("a sentence-pair student needs two tab-separated texts on each line, found "
                                f"{len(fields)} field(s)", path=name, line=number)
            rows.append(dict(zip(keys, fields if is_pair else [line])))
            texts.append(tuple(fields) if is_pair else line)
    elif fmt == "jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"not valid JSON ({exc.msg}); each line must be one object", path=name,
                                line=number) from None
            if not isinstance(record, dict):
                raise DataError("expected a JSON object per line", path=name, line=number)
            rows.append(record)
        keys = list(dict.fromkeys(key for row in rows for key in row))
        columns = pick_columns(keys, task_columns, is_pair, given, name)
        for number, row in enumerate(rows, start=1):
            if any(not isinstance(row.get(column), str) for column in columns):
                raise DataError(f"expected text in {', '.join(repr(c) for c in columns)}", path=name, line=number)
        texts = [tuple(row[c] for c in columns) if is_pair else row[columns[0]] for row in rows]
    else:
        reader = csv.reader(io.StringIO(text), delimiter="\t" if fmt == "tsv" else ",",
                            quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
        table = [(reader.line_num, fields) for fields in reader if any(field.strip() for field in fields)]
        if not table:
            raise UsageError(f"{name} is empty: expected a header line and texts")
        keys = [field.strip() for field in table[0][1]]
        columns = pick_columns(keys, task_columns, is_pair, given, name)
        rows = []
        for number, fields in table[1:]:
            if len(fields) != len(keys):
                raise DataError(f"expected {len(keys)} fields as in the header, found {len(fields)}", path=name,
                                line=number)
            rows.append(dict(zip(keys, fields)))
        texts = [tuple(row[c] for c in columns) if is_pair else row[columns[0]] for row in rows]
    if not texts:
        raise UsageError(f"{name} holds no texts to predict")
    return rows, keys, texts


def render(rows: list[dict], keys: list[str], predictions: list, labels: tuple[str, ...], fmt: str) -> str:
    if fmt == "jsonl":
        return "".join(json.dumps({**row, **prediction.as_dict()}, ensure_ascii=False) + "\n"
                       for row, prediction in zip(rows, predictions))
    added = ["score"] if not labels else ["label"] + [f"probability_{label}" for label in labels]
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t" if fmt == "tsv" else ",", lineterminator="\n",
                        quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL, escapechar="\\")
    writer.writerow(keys + added)
    for row, prediction in zip(rows, predictions):
        values: list[Any] = [row.get(key, "") for key in keys]
        if prediction.score is not None:
            values.append(f"{prediction.score:.6g}")
        else:
            values += [prediction.label] + [f"{prediction.probabilities[label]:.6f}" for label in labels]
        writer.writerow(values)
    return buffer.getvalue()


def write(path: str, text: str) -> None:
    """stdout, or the file written whole and renamed into place: nothing half-written."""
    if path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = Path(path)
    if not target.parent.is_dir():
        raise UsageError(f"the directory of --output {path} does not exist")
    write_atomic(target, text)

"""``kdplug export``: the trained student as its Hugging Face package or as ONNX, optionally int8 and
with a vocabulary trimmed to the task, each checked against the fp32 student and timed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UsageError
from ..plugins import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export",
        help="export a trained student: Hugging Face or ONNX, optionally int8 and with a trimmed vocabulary",
        description="--format hf: the standalone student directory (loads with transformers' Auto classes; "
        "BiLSTM and Gated-CNN also without kdplug, with trust_remote_code=True). --format onnx: model.onnx "
        "(dynamic batch and sequence axes) with the tokenizer and labels, checked with ONNX Runtime against "
        "PyTorch on the first 64 dev texts (the export fails above 1e-4). --quantize int8: dynamic int8 "
        "quantization (PyTorch: Linear and LSTM layers, built when the package is loaded; ONNX: ONNX Runtime's, "
        "int8 weights in the file), checked on the whole dev split: the dev metric of the fp32 and the int8 "
        "student and their agreement are printed, and an export that loses more than --max-drop points is "
        "refused. --trim-vocab: keep only the embedding rows of the tokens of the training split, the transfer "
        "set and --vocab-corpus FILE, and a tokenizer to match; checked on the dev split like int8, where the "
        "share of tokens it reads as unknown is printed (a warning when it is more than 1 point above the full "
        "vocabulary's). Every export prints its "
        "size and speed beside the fp32 student's.",
        epilog="examples:\n  kdplug export runs/demo --format onnx --output deploy/demo-onnx\n"
        "  kdplug export runs/demo --format onnx --quantize int8 --trim-vocab --output deploy/demo-int8\n"
        "  kdplug export runs/demo --format hf --output deploy/demo-hf\n"
        "  kdplug export runs/demo --push-to-hub my-org/demo-bilstm --private   # needs 'hf auth login'",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("run", metavar="RUN_DIR|STUDENT_DIR", help="a run directory or its student/ directory")
    parser.add_argument(
        "--format",
        choices=["onnx", "hf"],
        help="onnx or hf (required, except with --push-to-hub, which pushes hf by default)",
    )
    parser.add_argument("--output", help="a new or empty directory (required, except with --push-to-hub)")
    parser.add_argument("--quantize", choices=["int8"], help="dynamic int8 quantization, checked on the dev split")
    _add_vocabulary_options(parser)
    _add_drop_options(parser)
    _add_hub_options(parser)
    parser.add_argument(
        "--sample",
        help="texts to check the export on instead of the run's dev split (.tsv/.csv/.jsonl/.txt as for 'kdplug "
        "predict'; without gold labels, an int8 export's changed predictions count against --max-drop)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output")
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip checking the package against its checksums (for a package you changed on purpose)",
    )
    parser.set_defaults(handler=handle)


def _add_vocabulary_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trim-vocab",
        dest="trim_vocab",
        action="store_true",
        help="keep only the vocabulary of the training split, the transfer set and --vocab-corpus (WordPiece and "
        "unigram tokenizers)",
    )
    parser.add_argument(
        "--vocab-corpus",
        dest="vocab_corpus",
        metavar="FILE",
        help="with --trim-vocab: also keep the tokens of this text file (one text per line), e.g. unlabelled text of "
        "what the student will serve",
    )
    parser.add_argument(
        "--vocab-min-count",
        dest="vocab_min_count",
        type=int,
        default=1,
        metavar="N",
        help="with --vocab-corpus: keep a corpus token only if it occurs at least N times (default: 1)",
    )


def _add_drop_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-drop",
        dest="max_drop",
        type=float,
        default=1.0,
        metavar="POINTS",
        help="with --quantize or --trim-vocab: refuse an export that loses more points of the dev metric "
        "(default: 1.0)",
    )
    parser.add_argument(
        "--allow-drop",
        dest="allow_drop",
        action="store_true",
        help="keep a quantized or trimmed export beyond --max-drop",
    )


def _add_hub_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--push-to-hub",
        dest="push_to_hub",
        metavar="REPO",
        help="upload the export to this Hugging Face repository (owner/name; created if needed)",
    )
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    parser.add_argument("--revision", help="with --push-to-hub: the branch to push to (created if needed)")


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    import tempfile

    from ..export import check_output, check_push, export_hf, export_student, push_to_hub
    from ..inference import student_directory
    from ..integrity import refuse_outside_links, refuse_package_code, verify_package

    if not args.push_to_hub:
        missing = [flag for flag, value in (("--format", args.format), ("--output", args.output)) if not value]
        if missing:
            raise UsageError(f"kdplug export needs {' and '.join(missing)} (or --push-to-hub REPO)")
    if (args.private or args.revision) and not args.push_to_hub:
        raise UsageError("--private and --revision go with --push-to-hub REPO")
    if args.max_drop < 0:
        raise UsageError(f"--max-drop is a number of points, 0 or more; got {args.max_drop}")
    if (args.allow_drop or args.max_drop != 1.0) and not (args.quantize or args.trim_vocab):
        raise UsageError("--max-drop and --allow-drop go with --quantize int8 or --trim-vocab")
    if (args.vocab_corpus or args.vocab_min_count != 1) and not args.trim_vocab:
        raise UsageError("--vocab-corpus and --vocab-min-count go with --trim-vocab")
    if args.vocab_min_count < 1:
        raise UsageError(f"--vocab-min-count is a number of occurrences, 1 or more; got {args.vocab_min_count}")
    from ..vocab import read_corpus  # here: `kdplug --help` does not load torch

    corpus = read_corpus(args.vocab_corpus, "--vocab-corpus") if args.vocab_corpus else ()
    fmt = args.format or "hf"
    if args.output:
        check_output(args.output, args.overwrite)  # before any work
    source = student_directory(args.run)
    refuse_package_code(source)
    refuse_outside_links(source)  # nothing from outside the package is exported or uploaded
    if not args.no_verify:
        verify_package(source)  # once, before any work; the steps below trust it
    if args.push_to_hub:
        check_push(args.push_to_hub)
    plain = fmt == "hf" and not (args.quantize or args.trim_vocab)
    with tempfile.TemporaryDirectory(prefix="kdplug-export-") as scratch:
        if plain:
            if args.output:
                export_hf(args.run, args.output, overwrite=args.overwrite, verify=False)
                print(f"exported the student to {args.output} (Hugging Face format)")
            folder = Path(args.output) if args.output else source  # the package is the hf export
        else:
            folder = Path(args.output) if args.output else Path(scratch) / fmt
            dev = dev_set(args, manager)
            trim_texts = training_texts(args, manager) if args.trim_vocab else None
            report = export_student(
                args.run,
                folder,
                fmt=fmt,
                dev=dev,
                quantize=args.quantize,
                trim_texts=trim_texts,
                vocab_corpus=corpus,
                vocab_min_count=args.vocab_min_count,
                max_drop=args.max_drop,
                allow_drop=args.allow_drop,
                overwrite=args.overwrite,
                verify=False,
            )
            what = " ".join(filter(None, [fmt, args.quantize, "trimmed" if args.trim_vocab else None]))
            print(f"exported the student to {report.directory} ({what})")
            for line in report.lines():
                print(f"  {line}")
            for warning in report.warnings():
                print(f"warning: {warning}", file=sys.stderr)
        if args.push_to_hub:
            url = push_to_hub(folder, args.push_to_hub, private=args.private, revision=args.revision)
            print(f"pushed {fmt} export to {args.push_to_hub}: {url}")
    return 0


def _run_task(args: argparse.Namespace, manager: PluginManager, purpose: str):
    """The run's task and configuration, re-created from its config.yaml."""
    from ..config import build_config
    from ..layout import CONFIG_FILE

    path = Path(args.run)
    run_dir = path.parent if (path / "kdplug_student.json").is_file() else path
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(f"{args.run} is a student directory outside its run, so its data is unknown: {purpose}")
    config = build_config(file=str(run_dir / CONFIG_FILE))
    try:
        task = manager.registry.create("task", config.task, data_dir=config.data_dir, **config.task_options)
    except UsageError as exc:
        raise UsageError(f"could not read the run's data ({exc}): {purpose}") from None
    return task, config, run_dir


def _text(example):
    return (example.text_a, example.text_b) if example.text_b is not None else example.text_a


def dev_set(args: argparse.Namespace, manager: PluginManager):
    """What the export is checked on: --sample (texts, no labels), else the run's first dev split."""
    from ..export import DevSet
    from ..inference import load_student

    if args.sample:
        from .. import textio
        from ..textio import input_format, read_inputs

        student = load_student(args.run, device="cpu", verify=False)  # handle() verified it
        text = textio.read_text(args.sample, option=None)  # no option: --sample must be UTF-8
        texts = read_inputs(
            text, input_format(args.sample, None), args.sample, student.text_columns, student.is_pair, None
        )[2]
        return DevSet(texts, is_regression=student.is_regression, name="texts of --sample")
    task, _, _ = _run_task(args, manager, "pass --sample FILE with texts to check the export on")
    examples = task.load_split(task.dev_splits[0])
    return DevSet(
        [_text(e) for e in examples],
        labels=[e.label for e in examples],
        metrics=task.compute_metrics,
        main_metric=task.main_metric,
        is_regression=task.is_regression,
    )


def training_texts(args: argparse.Namespace, manager: PluginManager) -> list:
    """The texts a trimmed vocabulary keeps: the run's training split and its transfer set."""
    from ..layout import METRICS_FILE

    task, _, run_dir = _run_task(args, manager, "a trimmed vocabulary needs the run's training texts")
    texts = [_text(e) for e in task.load_split("train")]
    transfer = (
        json.loads((run_dir / METRICS_FILE).read_text()).get("transfer") if (run_dir / METRICS_FILE).is_file() else None
    )
    if transfer:
        from ..engine.transfer import TEXTS_FILE, TransferSet

        stored = TransferSet(Path(transfer["directory"]), transfer)
        if not (stored.directory / TEXTS_FILE).is_file():
            raise UsageError(
                f"the run's transfer set {stored.directory} is gone (kdplug cache clear?); its texts decide what a "
                f"trimmed vocabulary keeps: rerun the run to rebuild it, or export without --trim-vocab"
            )
        texts += [a if b is None else (a, b) for a, b in stored.texts()]
    return texts

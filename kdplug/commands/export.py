"""``kdplug export``: the trained student as ONNX (checked against PyTorch) or as its Hugging Face package."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from ..plugins import PluginManager


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export",
        help="export a trained student to ONNX or as a Hugging Face directory",
        description="--format onnx: model.onnx (dynamic batch and sequence axes) with the tokenizer and labels, "
        "checked with ONNX Runtime against PyTorch on the first 64 texts of the run's dev set: the largest "
        "absolute difference of the logits is printed, and the export fails above 1e-4. --format hf: "
        "a copy of the standalone student directory (loads with transformers' Auto classes).",
        epilog="examples:\n  kdplug export runs/demo --format onnx --output deploy/demo-onnx\n"
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
    parser.add_argument(
        "--push-to-hub",
        dest="push_to_hub",
        metavar="REPO",
        help="upload the export to this Hugging Face repository (owner/name; created if needed)",
    )
    parser.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    parser.add_argument("--revision", help="with --push-to-hub: the branch to push to (created if needed)")
    parser.add_argument(
        "--sample",
        help="texts to check the ONNX model on, the first 64 used (.tsv/.csv/.jsonl/.txt "
        "as for 'kdplug predict'); default: the run's first dev split",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export in --output")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace, manager: PluginManager) -> int:
    import tempfile

    from ..export import SAMPLE_SIZE, check_output, check_push, export_hf, export_onnx, push_to_hub
    from ..inference import student_directory

    if not args.push_to_hub:
        missing = [flag for flag, value in (("--format", args.format), ("--output", args.output)) if not value]
        if missing:
            raise UsageError(f"kdplug export needs {' and '.join(missing)} (or --push-to-hub REPO)")
    if (args.private or args.revision) and not args.push_to_hub:
        raise UsageError("--private and --revision go with --push-to-hub REPO")
    fmt = args.format or "hf"
    if args.output:
        check_output(args.output, args.overwrite)  # before any work
    source = student_directory(args.run)
    if args.push_to_hub:
        check_push(args.push_to_hub)
    with tempfile.TemporaryDirectory(prefix="kdplug-export-") as scratch:
        if fmt == "hf":
            if args.output:
                export_hf(args.run, args.output, overwrite=args.overwrite)
                print(f"exported the student to {args.output} (Hugging Face format)")
            folder = Path(args.output) if args.output else source  # the package is the hf export
        else:
            sample = sample_texts(args, manager)[:SAMPLE_SIZE]
            folder = Path(args.output) if args.output else Path(scratch) / "onnx"
            report = export_onnx(args.run, folder, sample=sample, overwrite=args.overwrite)
            print(
                f"exported the student to {report.directory / 'model.onnx'} (inputs {', '.join(report.inputs)}); "
                f"ONNX Runtime vs PyTorch on {report.sample_size} examples: largest absolute difference of "
                f"the logits {report.max_abs_diff:.2e} (tolerance 1e-4)"
            )
        if args.push_to_hub:
            url = push_to_hub(folder, args.push_to_hub, private=args.private, revision=args.revision)
            print(f"pushed {fmt} export to {args.push_to_hub}: {url}")
    return 0


def sample_texts(args: argparse.Namespace, manager: PluginManager) -> list:
    """The texts the ONNX model is checked on: --sample, else the run's first dev split."""
    from ..inference import load_student

    if args.sample:
        from .. import textio
        from ..textio import input_format, read_inputs

        student = load_student(args.run, device="cpu")
        text = textio.read_text(args.sample, option="--sample's encoding (save it as UTF-8)")
        return read_inputs(
            text, input_format(args.sample, None), args.sample, student.text_columns, student.is_pair, None
        )[2]
    from ..config import build_config
    from ..engine.rundir import CONFIG_FILE

    path = Path(args.run)
    run_dir = path.parent if (path / "kdplug_student.json").is_file() else path
    if not (run_dir / CONFIG_FILE).is_file():
        raise UsageError(
            f"{args.run} is a student directory outside its run, so its dev set is unknown; pass "
            f"--sample FILE with texts to check the ONNX model on"
        )
    config = build_config(file=str(run_dir / CONFIG_FILE))
    try:
        task = manager.registry.create("task", config.task, data_dir=config.data_dir, **config.task_options)
        examples = task.load_split(task.dev_splits[0])
    except UsageError as exc:
        raise UsageError(
            f"could not read the run's dev set to check the export ({exc}); pass --sample FILE with texts instead"
        ) from None
    return [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in examples]

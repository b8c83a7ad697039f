"""Export a trained student: ONNX (checked against PyTorch before it is kept) or the Hugging Face
package as it is; either can then be pushed to a Hugging Face hub repository.

ONNX goes through ``torch.onnx.export`` with the TorchScript exporter: the newer
``torch.export``-based one cannot trace the BiLSTM's packed sequences, which the TorchScript
exporter turns into ONNX's own ``LSTM`` with sequence lengths. Batch and sequence axes are
dynamic. The export is checked with ONNX Runtime against PyTorch on a sample of the run's dev
set; above ``tolerance`` (largest absolute difference of the logits) nothing is written.
"""

from __future__ import annotations

import inspect
import json
import shutil
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from .errors import KdplugError, UsageError
from .inference import INFO_FILE, LoadedStudent, Text, load_student
from .storage import atomic_directory

ONNX_FILE = "model.onnx"
OPSET = 17
TOLERANCE = 1e-4
SAMPLE_SIZE = 64


class ExportMismatchError(KdplugError):
    """The exported model does not compute what the student computes."""


@dataclass
class ExportReport:
    directory: Path
    max_abs_diff: Optional[float] = None
    sample_size: int = 0
    inputs: tuple[str, ...] = ()


class _LogitsOnly(nn.Module):
    """The student as ONNX sees it: token ids in, logits out."""

    def __init__(self, model: nn.Module, input_names: Sequence[str]) -> None:
        super().__init__()
        self.model, self.input_names = model, tuple(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, inputs))).logits


def check_output(output: Union[str, Path], overwrite: bool) -> Path:
    """An export goes to a new or empty directory, or with ``overwrite`` replaces an earlier export."""
    output = Path(output).expanduser()
    if output.exists() and not output.is_dir():
        raise UsageError(f"--output {output} exists and is not a directory; choose another")
    if output.is_dir() and any(output.iterdir()):
        earlier = (output / INFO_FILE).is_file()
        if not (overwrite and earlier):
            hint = "pass --overwrite to replace it" if earlier else "it was not written by kdplug, choose another"
            raise UsageError(f"--output {output} is not empty; {hint}")
    return output


def _encode(student: LoadedStudent, texts: Sequence[Text]) -> dict[str, torch.Tensor]:
    first = [t[0] if isinstance(t, tuple) else t for t in texts]
    second = [t[1] for t in texts] if student.is_pair else None
    return dict(
        student.tokenizer(
            first, second, truncation=True, max_length=student.max_length, padding=True, return_tensors="pt"
        )
    )


def _input_names(student: LoadedStudent, encoded: dict) -> list[str]:
    accepted = inspect.signature(student.model.forward).parameters
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in encoded and "token_type_ids" in accepted:
        names.append("token_type_ids")
    return names


def export_onnx(
    path: Union[str, Path],
    output: Union[str, Path],
    *,
    sample: Sequence[Text],
    tolerance: float = TOLERANCE,
    overwrite: bool = False,
) -> ExportReport:
    """``output/model.onnx`` plus the tokenizer, config and kdplug's record, checked on ``sample``."""
    try:
        import onnx  # noqa: F401  (the exporter writes through it)
        import onnxruntime
    except ImportError:
        raise UsageError("ONNX export needs the onnx and onnxruntime packages: pip install 'kdplug[deploy]'") from None

    output = check_output(output, overwrite)
    student = load_student(path, device="cpu")
    if not sample:
        raise UsageError("the export needs texts to check the ONNX model on; none were given")
    encoded = _encode(student, list(sample[:8]))
    names = _input_names(student, encoded)
    wrapper = _LogitsOnly(student.model, names).eval()
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["logits"] = {0: "batch"}
    with atomic_directory(output, f"the ONNX export {output}") as staging:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's advice about LSTMs: the check below is the proof
            torch.onnx.export(
                wrapper,
                tuple(encoded[name] for name in names),
                str(staging / ONNX_FILE),
                input_names=names,
                output_names=["logits"],
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
        session = onnxruntime.InferenceSession(str(staging / ONNX_FILE), providers=["CPUExecutionProvider"])
        worst = 0.0
        # batches of 16 and single examples: other batch sizes and lengths than the traced ones
        chunks = [list(sample[start : start + 16]) for start in range(0, len(sample), 16)]
        chunks += [[text] for text in sample[:4]]
        for chunk in chunks:
            batch = _encode(student, chunk)
            with torch.inference_mode():
                expected = wrapper(*(batch[name] for name in names)).numpy()
            got = session.run(["logits"], {name: batch[name].numpy() for name in names})[0]
            worst = max(worst, float(abs(got - expected).max()))
        if worst > tolerance:
            raise ExportMismatchError(
                f"the ONNX model differs from the student by up to {worst:.2e} in its logits "
                f"on {len(sample)} examples (tolerance {tolerance:g}); nothing was written"
            )
        _copy_package(student.directory, staging, skip=("model.safetensors",))
        info = json.loads((staging / INFO_FILE).read_text())
        info["onnx"] = {
            "file": ONNX_FILE,
            "opset": OPSET,
            "inputs": names,
            "outputs": ["logits"],
            "checked_on": len(sample),
            "max_abs_diff": worst,
        }
        (staging / INFO_FILE).write_text(json.dumps(info, indent=2))
    return ExportReport(output, worst, len(sample), tuple(names))


def export_hf(path: Union[str, Path], output: Union[str, Path], *, overwrite: bool = False) -> ExportReport:
    """A copy of the standalone student package (the Hugging Face format)."""
    from .inference import student_directory

    output = check_output(output, overwrite)
    source = student_directory(path)
    with atomic_directory(output, f"the export {output}") as staging:
        _copy_package(source, staging)
    return ExportReport(output)


def _copy_package(source: Path, target: Path, skip: Sequence[str] = ()) -> None:
    for item in source.iterdir():
        if item.name in skip or item.name.startswith("kdplug_checksums"):
            continue
        if item.is_dir():
            shutil.copytree(item, target / item.name)
        else:
            shutil.copy2(item, target / item.name)


# -- the hub ---------------------------------------------------------------------------------------


def check_push(repo_id: str) -> None:
    """Everything a push needs, checked before any export work: a valid repository id, a hub that
    can be reached and a token."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from . import hub

    try:
        validate_repo_id(repo_id)
    except HFValidationError as exc:
        raise UsageError(
            f"--push-to-hub {repo_id!r} is not a repository id ({exc}); use owner/name, e.g. my-org/sst2-bilstm"
        ) from None
    hub.require(
        f"push to {repo_id}",
        "export with --output DIR now and push the directory from a machine with "
        "network ('hf upload REPO DIR', or kdplug export again with --push-to-hub)",
    )
    if get_token() is None:
        raise UsageError(
            f"pushing to {repo_id} needs a Hugging Face token with write access: run 'hf auth login', or set HF_TOKEN"
        )


def push_to_hub(
    folder: Union[str, Path],
    repo_id: str,
    *,
    private: bool = False,
    revision: Optional[str] = None,
    commit_message: str = "Upload a student distilled with kdplug",
) -> str:
    """Upload an export (or a student package) to ``repo_id``, creating it if needed; the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            revision=revision,
            commit_message=commit_message,
            ignore_patterns=["kdplug_checksums*"],
        )
    except HfHubHTTPError as exc:
        status = getattr(exc.response, "status_code", None)
        hint = " (does the token have write access to it?)" if status in (401, 403) else ""
        raise KdplugError(
            f"the hub refused the push to {repo_id}{hint}: {str(exc).splitlines()[0]}; "
            f"{folder} is complete: push it again with 'hf upload {repo_id} {folder}'"
        ) from None
    return commit.commit_url

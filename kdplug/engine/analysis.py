"""What a trained student learned from which teacher layer, recorded on the dev set.

After the last distillation stage the engine writes, into the run directory:
- ``attention.json``: the projector's attention of each matched student layer over the teacher
  layers (ALP's α, Universal-KD's λ): the mean over the dev split and, per example, for the first
  ``examples`` dev inputs; plus ``attention.png``, a heatmap like ALP-KD's Figure 3;
- ``layers_dev.safetensors``: per-layer dev vectors of teacher and student (at most
  ``max_examples`` rows), and the pairs the projector compared, in the space where it compared
  them (ALP's student layer and its attention mix of teacher layers, Universal-KD's
  pseudo-classifier outputs, PKD's [CLS] vectors): ``pair.<p>.student``, ``pair.<p>.teacher``
  and ``pair.<p>.loss``, the ILD term of each example for that pair; the metadata ``pairs`` names
  them. The report draws its PCA and per-example distance plots from them (ALP-KD Figure 4).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors.torch import save_file

from ..capabilities import ProjectorCapabilities, capabilities
from ..layout import ATTENTION_FILE, ATTENTION_PLOT, LAYERS_FILE
from ..types import DistillInputs, LayerSpec
from .cache import TeacherCache
from .data import EncodedSplit
from .objective import DistillationModule, layer_vectors, model_forward

log = logging.getLogger(__name__)


@torch.no_grad()
def collect(
    module: DistillationModule,
    split: EncodedSplit,
    cache: TeacherCache,
    *,
    batch_size: int,
    max_examples: int,
    device: torch.device,
) -> tuple[Optional[torch.Tensor], list[torch.Tensor], list[torch.Tensor], Optional[tuple]]:
    """Attention ``(N, P, n)`` (None if the projector records none), student and teacher layers,
    and the projected pairs (student ``(N, P, D)``, teacher ``(N, P, D)``, the ILD loss of each
    example and pair ``(N, P)`` or None; all None for logit-only methods)."""
    from .data import Collator

    was_training = module.training
    module.eval()
    collate = Collator(split.pad_id, split.is_regression)
    attention, student_layers, teacher_layers, pair_students, pair_teachers, pair_losses = [], [], [], [], [], []
    count = min(len(split), max_examples)
    for start in range(0, count, batch_size):
        batch = collate([split[i] for i in range(start, min(start + batch_size, count))])
        batch = {key: value.to(device) for key, value in batch.items()}
        teacher_logits, teacher = cache.fetch(batch["index"], device)
        outputs = model_forward(module.student, batch)
        layers = layer_vectors(module.extractor, module.student, outputs, batch)
        student = [layers[i] for i in module.matchable_positions]
        heads = module.teacher_heads(teacher) if module.teacher_heads is not None else None
        if module.projector is not None and not module.needs_tokens:  # token methods need the teacher run live
            pairs = module.projector(
                DistillInputs(
                    teacher_layers=teacher,
                    student_layers=student,
                    teacher_logits=teacher_logits,
                    student_logits=outputs.logits,
                    teacher_head_logits=heads,
                )
            )
            if pairs is not None and pairs.attention is not None:
                attention.append(pairs.attention.float().cpu())
            vectors = pairs is not None and pairs.student is not None  # not a projector's own terms
            if vectors and capabilities(ProjectorCapabilities, module.projector).pairs_per_example:  # nor CKA's Grams
                pair_students.append(pairs.student.float().cpu())
                pair_teachers.append(pairs.teacher.float().cpu())
                # not through capabilities(): the objective's own loss module
                pair_losses.append(_per_pair_losses(getattr(module.objective, "ild_loss", None), pairs))
        student_layers.append([s.float().cpu() for s in student])
        teacher_layers.append([t.float().cpu() for t in teacher])
    module.train(was_training)
    merge = lambda chunks: [torch.cat(parts) for parts in zip(*chunks)] if chunks else []  # noqa: E731
    pairs = None
    if pair_students:
        losses = torch.cat(pair_losses) if all(loss is not None for loss in pair_losses) else None
        pairs = (torch.cat(pair_students), torch.cat(pair_teachers), losses)
    return (torch.cat(attention) if attention else None), merge(student_layers), merge(teacher_layers), pairs


def _per_pair_losses(loss: Any, pairs: Any) -> Optional[torch.Tensor]:
    """``(B, P)``: the ILD loss of each example and pair on its own, unweighted: the term the
    method minimised (None when the objective has no pair loss, e.g. DIH's own)."""
    if loss is None:
        return None
    batch, count = pairs.student.shape[:2]
    return torch.tensor(
        [
            [
                float(loss(pairs.student[i : i + 1, p : p + 1], pairs.teacher[i : i + 1, p : p + 1]))
                for p in range(count)
            ]
            for i in range(batch)
        ]
    )


def write(
    run_dir: Path,
    stage: str,
    module: DistillationModule,
    split_name: str,
    split: EncodedSplit,
    cache: TeacherCache,
    student_specs: list[LayerSpec],
    *,
    batch_size: int,
    device: torch.device,
    examples: int = 10,
    max_examples: int = 1000,
) -> dict:
    """Record attention and layer vectors of ``module`` on one dev split; returns what was written."""
    attention, student, teacher, pairs = collect(
        module, split, cache, batch_size=batch_size, max_examples=max_examples, device=device
    )
    written = {}
    tensors = {f"teacher.{spec.index}": t.contiguous() for spec, t in zip(cache.specs, teacher)}
    tensors.update({f"student.{spec.index}": s.contiguous() for spec, s in zip(student_specs, student)})
    metadata = {"stage": stage, "split": split_name}
    if pairs is not None:
        for p in range(pairs[0].shape[1]):
            tensors[f"pair.{p}.student"] = pairs[0][:, p].contiguous()
            tensors[f"pair.{p}.teacher"] = pairs[1][:, p].contiguous()
            if pairs[2] is not None:
                tensors[f"pair.{p}.loss"] = pairs[2][:, p].contiguous()
        metadata["pairs"] = json.dumps(
            pair_labels(
                pairs[0].shape[1],
                student_specs,
                cache.specs,
                attention,
                capabilities(ProjectorCapabilities, module.projector).layer_map,
            )
        )
        written["ild_loss"] = capabilities(ProjectorCapabilities, module.projector).ild_loss
    save_file(tensors, str(run_dir / LAYERS_FILE), metadata=metadata)
    written["layers"] = LAYERS_FILE
    if attention is not None:
        record = {
            "stage": stage,
            "split": split_name,
            "teacher_layers": [spec.index for spec in cache.specs],
            "student_rows": _row_labels(attention.shape[1], student_specs),
            "mean": attention.mean(dim=0).tolist(),  # (P, n)
            "examples": attention[:examples].tolist(),  # (examples, P, n)
            "num_examples": int(attention.shape[0]),
        }
        (run_dir / ATTENTION_FILE).write_text(json.dumps(record))
        heatmap(record, run_dir / ATTENTION_PLOT)
        written.update(attention=ATTENTION_FILE, attention_plot=ATTENTION_PLOT)
    return written


def pair_labels(
    count: int,
    student_specs: list[LayerSpec],
    teacher_specs: list[LayerSpec],
    attention: Optional[torch.Tensor],
    layer_map: Optional[tuple[int, ...]],
) -> list[dict]:
    """What each compared pair is: its student layer and the teacher side (a fixed teacher layer,
    or an attention mix named by the layer it weighs most)."""
    rows = _row_labels(count, student_specs)
    teacher_names = [f"T{spec.index}" for spec in teacher_specs]
    labels = []
    for p in range(count):
        if attention is not None and attention.shape[1] == count:
            weights = attention[:, p].mean(dim=0)
            peak = int(weights.argmax())
            if float(weights[peak]) > 0.999:  # one-hot: a fixed map that records its choice
                teacher = teacher_names[peak]
            else:
                share = float(weights[peak])
                teacher = f"attention mix of {len(teacher_names)} layers, peak {teacher_names[peak]} ({share:.2f})"
        elif layer_map is not None and len(layer_map) == count:
            teacher = f"T{layer_map[p]}"
        else:
            teacher = "teacher side"
        labels.append({"student": rows[p], "teacher": teacher})
    return labels


def _row_labels(rows: int, specs: list[LayerSpec]) -> list[str]:
    """Names of the P attention rows: student layers 1..m-1 (IL methods), the output layer m
    (capacity gap), every layer, or else numbered pairs."""
    indices = [spec.index for spec in specs]
    if rows == len(indices) - 1:
        return [f"S{i}" for i in indices[:-1]]
    if rows == 1:
        return [f"S{indices[-1]}"]
    if rows == len(indices):
        return [f"S{i}" for i in indices]
    return [f"pair {i + 1}" for i in range(rows)]


def heatmap(record: dict, path: Path) -> None:
    """The mean attention and a few examples as heatmaps (rows: student layers, columns: teacher layers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("mean over dev", record["mean"])] + [
        (f"example {i + 1}", a) for i, a in enumerate(record["examples"][:3])
    ]
    figure, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels) + 1, 2.6), squeeze=False)
    for axis, (title, values) in zip(axes[0], panels):
        image = axis.imshow(values, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        axis.set_title(title, fontsize=9)
        axis.set_xticks(range(len(record["teacher_layers"])), [f"T{i}" for i in record["teacher_layers"]], fontsize=7)
        axis.set_yticks(range(len(values)), record["student_rows"], fontsize=7)
    figure.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="attention weight")
    figure.suptitle(
        f"attention of student layers over teacher layers ({record['stage']}, {record['split']})", fontsize=10
    )
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)

"""kdplug's own cost: its trainer and its teacher pass against the bare PyTorch loops they wrap.

Student training (``nkd``: no teacher, so the loop alone is measured), one epoch and its dev
evaluation, three ways on the same model, the same batches (kdplug's length-grouped sampler, the
same seed), the same AdamW, linear warm-up schedule and evaluation:
  - kdplug: ``Trainer.fit``, as ``kdplug run`` trains a stage (checkpoints off, no early stopping);
  - bare: a plain PyTorch loop (forward, cross-entropy, backward, step, schedule; then argmax on dev),
    the limit for that model on this machine;
  - Hugging Face ``transformers.Trainer`` doing the same (its own sampler; one epoch, eval at its end).
The teacher pass: kdplug's ``build_cache`` (logits and every layer's [CLS] vector, to disk) against a
bare ``no_grad`` loop over the same batches collecting the same arrays in memory.

Each round times every variant once, in a rotated order, with freshly built models, so load that
comes and goes hits all of them; ratios are taken within a round and summarised by their median and
a 95% t-interval of the geometric mean (target: kdplug <= 1.05x the bare loop).

    python benchmarks/overhead.py [--examples 1600] [--rounds 5]
    python benchmarks/overhead.py --quick        # a smoke run
    python benchmarks/overhead.py --device cuda  # on a GPU (the default, auto, picks it when there is one)
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

import kdplug
from kdplug.compare import t_interval
from kdplug.engine import teacher as teacher_stage
from kdplug.engine.data import Collator, EncodedSplit
from kdplug.engine.objective import DistillationModule, WeightedObjective
from kdplug.engine.trainer import Trainer, make_optimizer
from kdplug.testing.tiny import TinyTask, wordpiece_tokenizer
from kdplug.types import Teacher

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_device import DEVICES, accelerator_on, clock, describe, pick_device  # noqa: E402

LR, WEIGHT_DECAY, WARMUP = 1e-3, 0.01, 0.1


def synthetic_split(count: int, vocab: int, seed: int) -> EncodedSplit:
    """SST-2-like lengths (4-64 tokens, a long tail) and random token ids and labels."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(2.9, 0.5, count).astype(int), 4, 64)
    ids = [[101, *rng.integers(1000, vocab, n - 2).tolist(), 102] for n in lengths]
    return EncodedSplit(
        input_ids=ids, token_type_ids=None, labels=rng.integers(0, 2, count).tolist(), is_regression=False, pad_id=0
    )


def minilm_sized_teacher() -> Teacher:
    """A MiniLM-L6-sized BERT (6 x 384) with random weights: speed does not depend on them."""
    torch.manual_seed(0)
    config = BertConfig(
        hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536, output_hidden_states=True
    )
    model = BertForSequenceClassification(config).eval().requires_grad_(False)
    tokenizer = wordpiece_tokenizer([f"w{i}" for i in range(config.vocab_size - 5)])
    return Teacher(model=model, tokenizer=tokenizer, source="random-minilm-sized", finetuned=True)


def new_student(registry, task, teacher, quick: bool):
    torch.manual_seed(0)
    options = {"embedding_dim": 32, "hidden_size": 32} if quick else {}
    return registry.create("student", "bilstm", task, teacher, **options)


# -- the three training loops ---------------------------------------------------------------------


def kdplug_epoch(registry, task, teacher, trainer, train, dev, quick) -> float:
    student = new_student(registry, task, teacher, quick)
    objective = WeightedObjective(
        eta=0.0, lam=0.0, task_loss=registry.create("loss", "ce"), kd_loss=None, ild_loss=None
    )
    module = DistillationModule(student, kdplug.find_layer_extractor(student), None, objective)
    started = clock(trainer.accelerator.device)
    trainer.fit("nkd", module, train, {"dev": dev}, epochs=1, lr=LR)
    return clock(trainer.accelerator.device) - started


def bare_epoch(registry, task, teacher, trainer, train, dev, quick) -> float:
    device = trainer.accelerator.device
    student = new_student(registry, task, teacher, quick).to(device)
    loader, sampler = trainer.loader(train, shuffle=True)  # kdplug's batches, so only the loop differs
    dev_loader, _ = trainer.loader(dev, shuffle=False)
    started = clock(device)
    sampler.set_epoch(1)
    optimizer = make_optimizer(student, LR, WEIGHT_DECAY)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(WARMUP * len(loader)), len(loader))
    student.train()
    for batch in loader:
        batch = {key: value.to(device) for key, value in batch.items()}
        logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        torch.nn.functional.cross_entropy(logits, batch["labels"]).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    student.eval()
    predictions = []
    with torch.inference_mode():
        for batch in dev_loader:
            ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
            predictions.append(student(input_ids=ids, attention_mask=mask).logits)
    torch.cat(predictions).argmax(-1).tolist()
    return clock(device) - started


def hf_epoch(registry, task, teacher, trainer, train, dev, quick) -> float:
    from transformers import PrinterCallback, TrainingArguments
    from transformers import Trainer as HFTrainer

    student = new_student(registry, task, teacher, quick)
    collate = Collator(train.pad_id, False)

    def collator(items):
        batch = collate(items)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": batch["labels"]}

    class CrossEntropyTrainer(HFTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            labels = inputs.pop("labels")
            outputs = model(**inputs)
            loss = torch.nn.functional.cross_entropy(outputs.logits, labels)
            return (loss, outputs) if return_outputs else loss

    with tempfile.TemporaryDirectory() as output:
        arguments = TrainingArguments(
            output_dir=output,
            per_device_train_batch_size=trainer.batch_size,
            per_device_eval_batch_size=trainer.batch_size,
            num_train_epochs=1,
            learning_rate=LR,
            weight_decay=WEIGHT_DECAY,
            warmup_steps=int(WARMUP * math.ceil(len(train) / trainer.batch_size)),
            lr_scheduler_type="linear",
            eval_strategy="epoch",
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            disable_tqdm=True,
            use_cpu=trainer.accelerator.device.type == "cpu",
            remove_unused_columns=False,  # the collator needs every field of an example
            seed=0,
        )
        hf = CrossEntropyTrainer(
            model=student, args=arguments, train_dataset=train, eval_dataset=dev, data_collator=collator
        )
        hf.remove_callback(PrinterCallback)  # its per-epoch prints are not part of the loop
        started = clock(trainer.accelerator.device)
        hf.train()
        return clock(trainer.accelerator.device) - started


# -- the teacher pass -----------------------------------------------------------------------------


def kdplug_teacher_pass(teacher, trainer, task, split) -> float:
    with tempfile.TemporaryDirectory() as root:
        started = clock(trainer.accelerator.device)
        teacher_stage.build_cache(
            teacher,
            kdplug.find_layer_extractor(teacher.model),
            trainer,
            task,
            "train",
            split,
            root=Path(root),
            precision="fp32",
            teacher_fingerprint="bench",
            tokenizer_fingerprint="bench",
        )
        return clock(trainer.accelerator.device) - started


def bare_teacher_pass(teacher, trainer, task, split) -> float:
    device = trainer.accelerator.device
    teacher.model.to(device)
    loader, _ = trainer.loader(split, shuffle=False, batch_size=trainer.batch_size * 2)  # as build_cache batches
    started = clock(device)
    logits, layers = [], []
    with torch.no_grad():
        for batch in loader:
            outputs = teacher.model(
                input_ids=batch["input_ids"].to(device),
                attention_mask=batch["attention_mask"].to(device),
                output_hidden_states=True,
            )
            logits.append(outputs.logits.float().cpu().numpy())
            layers.append(torch.stack([h[:, 0] for h in outputs.hidden_states], 1).half().cpu().numpy())
    np.concatenate(logits), np.concatenate(layers)
    return clock(device) - started


def summarise(name: str, seconds: dict[str, list[float]], reference: str, variant: str) -> str:
    ratios = [a / b for a, b in zip(seconds[variant], seconds[reference])]
    median = statistics.median(ratios)
    if len(ratios) > 1:
        low, high = (math.exp(bound) for bound in t_interval([math.log(r) for r in ratios]))
        interval = f"[{low:.3f}, {high:.3f}]"
    else:
        interval = "(one round)"
    return (
        f"{name:<38} {statistics.median(seconds[variant]):8.2f} {statistics.median(seconds[reference]):8.2f} "
        f"{median:7.3f}x {interval:>16}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=1600, help="training examples (dev: a quarter)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 96 examples, a small BiLSTM, 2 rounds")
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto (default): CUDA when available")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    if args.quick:
        args.examples, args.rounds = 96, 2
    logging.getLogger("kdplug").setLevel(logging.ERROR)  # a random student's health warnings, every round
    registry = kdplug.get_plugin_manager().registry
    task, teacher = TinyTask(), minilm_sized_teacher()
    train = synthetic_split(args.examples, teacher.model.config.vocab_size, seed=0)
    dev = synthetic_split(max(8, args.examples // 4), teacher.model.config.vocab_size, seed=1)
    trainer = Trainer(accelerator_on(device), task, batch_size=args.batch_size, seed=0, weight_decay=WEIGHT_DECAY)
    print(
        f"kdplug overhead: {args.examples} training and {len(dev)} dev examples, batch {args.batch_size}, "
        f"{describe(device)}, {args.rounds} interleaved rounds; BiLSTM student "
        f"({'small' if args.quick else 'default size'}), MiniLM-sized teacher (random weights)\n"
    )
    loops = {"kdplug": kdplug_epoch, "bare": bare_epoch, "hf": hf_epoch}
    passes = {"kdplug": kdplug_teacher_pass, "bare": bare_teacher_pass}
    trained: dict[str, list[float]] = {name: [] for name in loops}
    teacher_seconds: dict[str, list[float]] = {name: [] for name in passes}
    for round_index in range(args.rounds):
        order = list(loops)[round_index % 3 :] + list(loops)[: round_index % 3]
        for name in order:
            trained[name].append(loops[name](registry, task, teacher, trainer, train, dev, args.quick))
        for name in list(passes)[round_index % 2 :] + list(passes)[: round_index % 2]:
            teacher_seconds[name].append(passes[name](teacher, trainer, task, train))
    header = f"{'what':<38} {'s':>8} {'bare s':>8} {'ratio':>8} {'95% CI (geo.)':>16}"
    print(header)
    print("-" * len(header))
    print(summarise("kdplug trainer, an epoch + dev eval", trained, "bare", "kdplug"))
    print(summarise("HF Trainer, an epoch + dev eval", trained, "bare", "hf"))
    print(summarise("kdplug teacher pass (build_cache)", teacher_seconds, "bare", "kdplug"))
    print("\ntarget: kdplug <= 1.05x the bare loop")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

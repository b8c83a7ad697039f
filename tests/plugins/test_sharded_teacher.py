"""A teacher sharded by ``teacher_options.device_map`` with a memory limit so small that layers are
offloaded to the CPU and to disk: its cached outputs (logits and layer vectors) are the one-device
teacher's, under the same cache key; the dry run says where its layers go; options that cannot
work are refused before any weights load."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kdplug.cli import main
from kdplug.engine.teacher import teacher_fingerprint
from kdplug.testing.decoders import make_tiny_causal_lm
from kdplug.testing.tiny import TinyTask, make_tiny_classifier
from kdplug_models.prompted import prompted_teacher

from ..conftest import SST2_DEV, SST2_TRAIN, write_sst2

#: room on the CPU for the embeddings, the head and the first of the four blocks: the rest goes to disk
CPU_LIMIT = '{"cpu": "90KiB"}'


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    return {
        "classifier": make_tiny_classifier(root / "classifier", num_layers=4),
        "data": write_sst2(root / "SST-2", train=SST2_TRAIN, dev=SST2_DEV),
        "root": root,
    }


def run_args(workspace, output, cache, *options, projector="alp"):
    """A tiny in-process run distilling the classifier into a BiLSTM with ALP (which reads layer vectors)."""
    argv = ["run", "--teacher", workspace["classifier"], "--student", "bilstm", "--projector", projector]
    argv += ["--task", "sst2", "--data-dir", str(workspace["data"]), "--epochs", "1", "--cache-dir", str(cache)]
    argv += ["--set", "allow_weak_teacher=true", "--set", "measure_speed=false"]
    argv += ["--set", "student_options.embedding_dim=16", "--set", "student_options.hidden_size=16"]
    for option in options:
        argv += ["--set", f"teacher_options.{option}"]
    return argv + ["--output", str(output)]


def sharded(folder, memory=CPU_LIMIT):
    return ("device_map=auto", f"max_memory={memory}", f"offload_folder={folder}")


def cached(cache: Path) -> dict[str, np.ndarray]:
    """Every teacher-cache entry's data by its key and file."""
    entries = {}
    for data in sorted((cache / "teacher-cache").glob("*/*.f*")):
        dtype = np.float16 if data.suffix == ".f16" else np.float32
        entries[f"{data.parent.name}/{data.name}"] = np.fromfile(data, dtype=dtype)
    return entries


def test_a_sharded_teacher_caches_the_one_device_teachers_outputs_under_its_key(workspace, tmp_path):
    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / "mine.txt").write_text("the user's")  # kdplug leaves the user's folder as it is
    assert main(run_args(workspace, tmp_path / "one", tmp_path / "cache-one")) == 0
    assert main(run_args(workspace, tmp_path / "sharded", tmp_path / "cache-sharded", *sharded(offload))) == 0

    placed = json.loads((tmp_path / "sharded" / "metrics.json").read_text())["teacher"]["device_map"]
    assert {"cpu", "disk"} <= set(placed.values()), placed  # offloaded to both
    one, two = cached(tmp_path / "cache-one"), cached(tmp_path / "cache-sharded")
    assert sorted(one) == sorted(two) and len(one) == 4  # the same keys: logits and layers of train and dev
    assert any(name.endswith("layers.f16") for name in one)
    for name, values in one.items():
        np.testing.assert_allclose(two[name], values, atol=1e-6, rtol=0)
    assert [p.name for p in offload.iterdir()] == ["mine.txt"] and (offload / "mine.txt").read_text() == "the user's"


def test_a_sharded_prompted_teacher_gives_the_one_device_outputs(tmp_path):
    lm = make_tiny_causal_lm(tmp_path / "lm", layers=4)
    task = TinyTask(name="sst2")
    options = {"prompt": "Review: {text}\nSentiment:", "verbalizer": {"negative": " bad film", "positive": " good"}}
    one = prompted_teacher(task, lm, **options)
    placed = prompted_teacher(
        task, lm, **options, device_map="auto", max_memory={"cpu": "120KiB"}, offload_folder=str(tmp_path / "offload")
    )
    assert {"cpu", "disk"} <= set(placed.extra["device_map"].values()), placed.extra["device_map"]
    assert placed.placed_on == "cpu" and one.placed_on is None
    for text in ("a good film", "bad"):
        ids = torch.tensor([one.encoder.prompt_ids(text)], dtype=torch.long)
        with torch.no_grad():
            expected = one.model(input_ids=ids, attention_mask=torch.ones_like(ids))
            got = placed.model(input_ids=ids, attention_mask=torch.ones_like(ids))
        torch.testing.assert_close(got.logits, expected.logits, atol=1e-6, rtol=0)
        for layer, (a, b) in enumerate(zip(got.hidden_states, expected.hidden_states)):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=f"layer {layer}")
    assert teacher_fingerprint(placed.model) == teacher_fingerprint(one.model)  # the cache key's teacher part


def test_the_dry_run_says_the_size_and_where_the_layers_go(workspace, tmp_path, capsys):
    args = run_args(workspace, tmp_path / "run", tmp_path / "cache", *sharded(tmp_path / "off"))
    assert main([*args, "--dry-run"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "device_map" in line)
    assert re.search(
        r"teacher: 155\.3 KiB in float32; device_map auto: layers 0 on cpu, 1-3 on disk; "
        r"bert\.embeddings, dropout, classifier on cpu; bert\.pooler on disk$",
        line,
    ), line
    assert not (tmp_path / "cache" / "teacher-cache").exists()


@pytest.fixture(scope="module")
def unreadable_weights(workspace):
    """The classifier with its weights file replaced by garbage: a refusal that comes after weights
    load would be safetensors' error instead of kdplug's."""
    directory = workspace["root"] / "garbage-weights"
    shutil.copytree(workspace["classifier"], directory)
    (directory / "model.safetensors").write_bytes(b"not safetensors")
    return str(directory)


@pytest.mark.parametrize(
    "options, message",
    [
        (["device_map=3"], r"teacher_options\.device_map of teacher 'hf' must be text or a mapping, or null, got 3"),
        (
            ['device_map={"bert.nowhere": "cpu", "classifier": "cpu"}'],
            r"names 'bert\.nowhere', which the teacher .* no module",
        ),
        (
            ['device_map={"bert.embeddings": "cpu"}'],
            r"places no device for bert\.encoder, bert\.pooler, classifier: name every module",
        ),
        (
            ['device_map={"": "cpu", "bert.encoder.layer.1": "disk"}'],
            r"names 'bert\.encoder\.layer\.1' inside '', which it also places: name each module once",
        ),
        (
            ['device_map={"bert": "cpu", "bert.encoder": "disk", "dropout": "cpu", "classifier": "cpu"}'],
            r"names 'bert\.encoder' inside 'bert', which it also places",
        ),
        (
            ['device_map={"": "cpu"}', 'max_memory={"cpu": "1GiB"}'],
            r"max_memory limits what device_map auto, balanced, .* a map \{module: device\} places every module",
        ),
        (["device_map=sideways"], r"must be one of auto, balanced, balanced_low_0, sequential or a map"),
        (
            ['device_map={"": "mps"}'],
            r"device_map\[''\] must be a GPU index \(0, 1 \.\.\.\), cuda:N, cpu or disk; got 'mps'",
        ),
        (['device_map={"": "meta"}'], r"must be a GPU index .* got 'meta'"),
        (['device_map={"": "xpu:0"}'], r"must be a GPU index .* got 'xpu:0'"),
        (['device_map={"": "npu"}'], r"must be a GPU index .* got 'npu'"),
        (["device_map=auto", 'max_memory={"mps": "1GiB"}'], r"max_memory \('mps'\) must be a GPU index"),
        (
            ["device_map=auto", 'max_memory={"cpu": 1.5}'],
            r"max_memory\['cpu'\] must be a size such as \"20GiB\".* got 1\.5$",
        ),
        (
            ["device_map=auto", 'max_memory={"cpu": null}'],
            r"max_memory\['cpu'\] must be a size .*whole number of bytes.* got None$",
        ),
        (["device_map=auto", 'max_memory={"cpu": true}'], r"max_memory\['cpu'\] must be a size .* got True$"),
        (
            ["device_map=auto", 'max_memory={"cpu": "lots"}'],
            r"max_memory\['cpu'\] must be a size such as \"20GiB\".* got 'lots'",
        ),
        (["device_map=auto", 'max_memory={"cpu": -5}'], r"max_memory\['cpu'\] must be a size .* got -5"),
        (["device_map=auto", 'max_memory={"7": "1GiB"}'], r"names GPU 7, and this machine has"),
        (["device_map=auto", "offload_folder=FILE"], r"offload_folder .* is a file, not a folder"),
        (
            ["device_map=auto", "offload_folder=FILE/inside"],
            r"offload_folder .*/inside cannot be created: .*a-file is a file",
        ),
        (
            ["device_map=auto", "offload_folder=LINK/inside"],
            r"offload_folder .*/inside cannot be created: .*/dangling is a broken symbolic link \(to .*/nowhere\)",
        ),
        (
            ["device_map=auto", "offload_folder=/proc/kdplug-offload"],
            r"offload_folder /proc/kdplug-offload: /proc is not",
        ),
        (
            ["device_map=auto", f"max_memory={CPU_LIMIT}"],
            r"puts some of the teacher's modules on disk .*offload_folder",
        ),
        (['max_memory={"cpu": "1GiB"}'], r"add --set teacher_options\.device_map=auto"),
        (["device_map=auto", "finetuned=false"], r"shards a teacher to run it, not to train it"),
    ],
)
def test_what_cannot_work_is_refused_before_weights_load(
    workspace, unreadable_weights, tmp_path, capsys, options, message
):
    folder_file = tmp_path / "a-file"
    folder_file.write_text("mine")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    options = [
        option.replace("FILE", str(folder_file)).replace("LINK", str(tmp_path / "dangling")) for option in options
    ]
    argv = run_args({**workspace, "classifier": unreadable_weights}, tmp_path / "run", tmp_path / "cache", *options)
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert "Traceback" not in err and folder_file.read_text() == "mine"


def test_a_launch_of_several_processes_is_refused(workspace, tmp_path, capsys, monkeypatch):
    """Each process would load the whole teacher over every GPU: one process shards it."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    argv = run_args(workspace, tmp_path / "run", tmp_path / "cache", "device_map=auto")
    assert main([*argv, "--dry-run"]) == 2
    assert "this launch has 2 (WORLD_SIZE): run it as one process" in capsys.readouterr().err


def test_a_teacher_that_would_be_fine_tuned_is_refused_with_what_to_do(tmp_path, tiny_bert_dir, capsys):
    data = write_sst2(tmp_path / "SST-2")
    argv = ["run", "--teacher", tiny_bert_dir, "--student", "bilstm", "--task", "sst2", "--data-dir", str(data)]
    argv += ["--set", "teacher_options.device_map=auto", "--set", "allow_weak_teacher=true"]
    argv += ["--dry-run", "--output", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "would be fine-tuned first (it has no classification head with the task sst2's 2 output(s))" in err
    assert "Fine-tune it first" in err and "pass the fine-tuned checkpoint" in err
    assert not os.listdir(tmp_path / "run") if (tmp_path / "run").exists() else True


def test_a_student_copies_a_sharded_teachers_offloaded_weights(workspace, tmp_path):
    """BERT-k from the teacher's own layers, with its head, and a BiLSTM from its embeddings: the weights
    the one-device teacher gives, though the sharded teacher holds its offloaded ones on the meta device."""
    import kdplug

    task = TinyTask(name="sst2")
    one = kdplug.create_teacher("hf", task, source=workspace["classifier"])
    placed = kdplug.create_teacher(
        "hf", task, source=workspace["classifier"], device_map={"": "disk"}, offload_folder=str(tmp_path / "offload")
    )
    assert placed.model.bert.encoder.layer[0].attention.self.query.weight.is_meta
    students = [
        kdplug.create_student("bert-2", task, teacher, init="teacher", copy_classifier=True)
        for teacher in (one, placed)
    ]
    expected, got = (student.state_dict() for student in students)
    assert sorted(expected) == sorted(got)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, atol=0, rtol=0, msg=name)
    tables = [kdplug.api.fingerprint.readable(t.model, t.model.get_input_embeddings().weight) for t in (one, placed)]
    torch.testing.assert_close(tables[1], tables[0], atol=0, rtol=0)


def test_a_map_that_splits_a_block_is_described_by_its_parts(workspace):
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from kdplug_models.placement import describe

    with init_empty_weights():
        model = AutoModelForSequenceClassification.from_config(AutoConfig.from_pretrained(workspace["classifier"]))
    layer = "bert.encoder.layer"
    device_map = {"bert.embeddings": "cpu", f"{layer}.0": "cpu", f"{layer}.1.attention": "cpu"}
    device_map |= {f"{layer}.1.intermediate": "disk", f"{layer}.1.output": "disk", "bert.encoder.layer.2": "disk"}
    device_map |= {"bert.encoder.layer.3": "disk", "bert.pooler": "disk", "classifier": "cpu"}
    assert describe(model, device_map) == (
        "layers 0 on cpu, 1 on cpu+disk, 2-3 on disk; bert.embeddings, classifier on cpu; bert.pooler on disk"
    )


def test_a_sharded_classifiers_head_is_put_in_the_tasks_label_order(tmp_path):
    """Its outputs named in the other order: kdplug reorders the head's rows, which the map would have
    put on disk, so it keeps the head in memory; the logits are the one-device teacher's."""
    import kdplug

    source = make_tiny_classifier(tmp_path / "reversed", order=[1, 0], num_layers=2)
    task = TinyTask(name="sst2")
    one = kdplug.create_teacher("hf", task, source=source)
    on_disk = {"bert": "disk", "dropout": "disk", "classifier": "disk"}
    placed = kdplug.create_teacher("hf", task, source=source, device_map=on_disk, offload_folder=str(tmp_path))
    ids = torch.tensor([[2, 7, 9, 3]])
    with torch.no_grad():
        torch.testing.assert_close(placed.model(input_ids=ids).logits, one.model(input_ids=ids).logits, atol=0, rtol=0)
    assert placed.extra["device_map"]["classifier"] == "cpu" and placed.extra["device_map"]["bert"] == "disk"
    assert "reordered to the task's order" in " ".join(placed.notes)


def test_a_failed_load_leaves_no_offload_folder(unreadable_weights, tmp_path):
    """The weights cannot be read: kdplug's folder for this load goes; the user's folder and file stay."""
    from safetensors import SafetensorError

    import kdplug

    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / "mine.txt").write_text("the user's")
    with pytest.raises(SafetensorError, match="deserializing header"):
        kdplug.create_teacher(
            "hf", TinyTask(name="sst2"), source=unreadable_weights, device_map={"": "disk"}, offload_folder=str(offload)
        )
    assert [p.name for p in offload.iterdir()] == ["mine.txt"]


def test_the_offload_folder_of_a_killed_run_is_removed_by_the_next(workspace, tmp_path, caplog):
    """A process SIGKILLed while it holds its kdplug-offload-* folder: the next load into the same
    offload_folder removes it (its owner is dead), and nothing else (a live owner's, the user's)."""
    import kdplug
    from kdplug_models.placement import OWNER_FILE

    offload = tmp_path / "offload"
    offload.mkdir()
    (offload / "kdplug-offload-users").mkdir()  # no owner file: not kdplug's
    live = offload / "kdplug-offload-live"
    live.mkdir()
    (live / OWNER_FILE).write_text(f"{os.getpid()}\n")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = offload / "kdplug-offload-dead"
    dead.mkdir()
    (dead / OWNER_FILE).write_text(f"{child.pid}\n")
    (dead / "weights.dat").write_bytes(b"0" * 1000)
    child.send_signal(signal.SIGKILL)
    child.wait()
    kdplug.create_teacher(
        "hf",
        TinyTask(name="sst2"),
        source=workspace["classifier"],
        device_map={"": "disk"},
        offload_folder=str(offload),
    )
    assert sorted(p.name for p in offload.iterdir()) == ["kdplug-offload-live", "kdplug-offload-users"]
    assert f"removed {dead}: offloaded weights of a kdplug run (process {child.pid})" in caplog.text


def test_resume_may_change_where_the_teacher_runs_and_its_batches_not_what_it_trains(tmp_path):
    """Placement and token budgets change neither the teacher's outputs nor the cache key: allowed on
    --resume; a teacher option that changes the teacher is still refused."""
    from kdplug.commands.run import check_resume_settings
    from kdplug.config import build_config
    from kdplug.errors import UsageError

    base = {"teacher": "hf", "student": "bilstm", "task": "sst2", "output": str(tmp_path / "run")}
    written = build_config(base=base)
    changed = [
        "teacher_tokens_per_batch=4096",
        "eval_tokens_per_batch=2048",
        "teacher_options.device_map=auto",
        "teacher_options.max_memory={cpu: 1GiB}",
        f"teacher_options.offload_folder={tmp_path}",
    ]
    check_resume_settings(written, build_config(base=base, overrides=changed))
    with pytest.raises(UsageError, match="change what it trains .*teacher_options"):
        check_resume_settings(written, build_config(base=base, overrides=["teacher_options.dtype=float16"]))


def test_a_relative_offload_folder_is_kept_absolute_in_config_yaml(tmp_path, monkeypatch):
    """config.yaml names the folder it was given from, so --resume elsewhere offloads into the same one."""
    from kdplug.config import build_config, dump_yaml

    monkeypatch.chdir(tmp_path)
    config = build_config(overrides=["teacher_options.device_map=auto", "teacher_options.offload_folder=offload"])
    assert config.teacher_options["offload_folder"] == str(tmp_path / "offload")
    assert str(tmp_path / "offload") in dump_yaml(config)


def test_an_empty_max_memory_is_no_limit(workspace, tmp_path, capsys):
    """{} names no device: as unset, not as no memory anywhere (which put every module on disk)."""
    args = run_args(workspace, tmp_path / "run", tmp_path / "cache", "device_map=auto", "max_memory={}")
    assert main([*args, "--dry-run"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "device_map" in line)
    assert "disk" not in line and "layers 0-3 on cpu" in line, line


def test_a_size_in_bytes_may_be_given_as_text(workspace, tmp_path, capsys):
    """{cpu: "0"} is {cpu: 0}: no memory on the CPU, every module on disk."""
    lines = []
    for size in ("0", 0):
        args = run_args(
            workspace, tmp_path / "run", tmp_path / "cache", *sharded(tmp_path / "off", f'{{"cpu": {size!r}}}')
        )
        assert main([*args, "--dry-run"]) == 0, capsys.readouterr().err
        lines.append(next(line for line in capsys.readouterr().out.splitlines() if "device_map" in line))
    assert lines[0] == lines[1] and "layers 0-3 on disk" in lines[0], lines

"""A task's examples cost about their text's bytes, not a Python object each (the scale issue's
flat memory): measured with tracemalloc on a real local task read from a CSV file."""

from __future__ import annotations

import csv
import random
import tracemalloc

import kdplug
from kdplug.types import Example

ROWS = 20_000


def write_csv(path, rows: int, seed: int = 0) -> int:
    """A CSV of ``rows`` labelled sentences; the UTF-8 bytes of its texts."""
    rng = random.Random(seed)
    words = "the film was a superb dull moving plot story warm clumsy ending café naïve".split()
    text_bytes = 0
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for _ in range(rows):
            text = " ".join(rng.choices(words, k=rng.randint(4, 16)))
            text_bytes += len(text.encode("utf-8"))
            writer.writerow([text, rng.choice(["negative", "positive"])])
    return text_bytes


def test_a_local_task_holds_its_examples_in_about_their_texts_bytes(tmp_path):
    text_bytes = write_csv(tmp_path / "train.csv", ROWS)
    write_csv(tmp_path / "dev.csv", 100, seed=1)
    (tmp_path / "warm").mkdir()  # a first small task: the plugins' modules are imported before measuring
    write_csv(tmp_path / "warm" / "train.csv", 10), write_csv(tmp_path / "warm" / "dev.csv", 10)
    kdplug.create_task("local", data_dir=str(tmp_path / "warm")).load_split("train")
    tracemalloc.start()
    try:
        task = kdplug.create_task("local", data_dir=str(tmp_path))
        train = task.load_split("train")
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the texts' own bytes, plus 8 for an offset, 8 for a label and 8 for a line number an example
    # (a list of Example objects over Python strings held about 600 bytes an example beside them)
    assert held < text_bytes + 40 * ROWS, (held / ROWS, text_bytes / ROWS)
    assert peak < 2 * text_bytes + 60 * ROWS, (peak / ROWS, text_bytes / ROWS)  # growing buffers double
    assert len(train) == ROWS and isinstance(train[0], Example) and train[-1] == list(train)[-1]
    assert {example.label for example in train} == {0, 1}
    assert task.load_split("train") == list(train)  # it reads like the list it replaces

"""Shared set-up of the kit's tests: one tiny workspace, GLUE-layout files for every GLUE task."""

from __future__ import annotations

import pytest

from kdplug.testing.contracts import Workspace


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> Workspace:
    return Workspace(tmp_path_factory.mktemp("contract-workspace"))


GLUE_SENTENCES = [
    "the movie was very good .",
    "we hated the plot",
    "a nice film",
    "the acting was awful",
    "i loved the music",
    "it was not fun",
]


def write_glue_task(root, spec) -> str:
    """Six train and three dev lines per split in ``spec``'s layout of the original GLUE download."""
    directory = root / spec.folder
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", *spec.dev_splits):
        rows = []
        for i, text in enumerate(GLUE_SENTENCES[: 6 if split == "train" else 3]):
            label = spec.label_values[i % len(spec.label_values)] if spec.labels else f"{(i * 0.9) % 5:.2f}"
            record = {spec.text_columns[0]: text, spec.label_column: label}
            if spec.is_pair:
                record[spec.text_columns[1]] = GLUE_SENTENCES[-1 - i]
            if spec.fieldnames:  # headerless (CoLA)
                record.update(source="gj04", author_label="")
                rows.append("\t".join(record[f] for f in spec.fieldnames))
            else:
                columns = list(record)
                if not rows:
                    rows.append("\t".join(columns))
                rows.append("\t".join(record[c] for c in columns))
        (directory / f"{split}.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return str(directory)


@pytest.fixture(scope="session")
def glue_dirs(tmp_path_factory) -> dict[str, str]:
    from kdplug_tasks.glue import SPECS

    root = tmp_path_factory.mktemp("glue")
    return {name: write_glue_task(root, spec) for name, spec in SPECS.items()}

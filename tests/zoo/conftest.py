"""A tiny two-point sweep shared by the sweep and report tests (the slow part: run it once)."""

from __future__ import annotations

import pytest

from kdplug.cli import main
from kdplug.testing import set_args, tiny_run_settings


def tiny_overrides(teacher: str, data_dir) -> list[str]:
    """Every zoo run in these tests: the tiny teacher, one short epoch, small batches (the zoo entry
    names the student and the method)."""
    tiny = tiny_run_settings(student=None, projector=None, student_options=None, batch_size=4, teacher_batch_size=4)
    return set_args({"teacher": teacher, "data_dir": data_dir, **tiny})


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory, tiny_bert_dir):
    """``kdplug sweep`` over two projectors of ALP-KD Table 1 (SST-2), tiny BERT-2 students."""
    from tests.conftest import write_sst2

    root = tmp_path_factory.mktemp("sweep")
    data = write_sst2(root / "SST-2")
    argv = [
        "sweep",
        "--zoo",
        "alp-kd/table1-sst2-alp",
        *tiny_overrides(tiny_bert_dir, data),
        "--set",
        "student=bert-2",
        "--set",
        f"cache_dir={root / 'cache'}",
        "--grid",
        "projector=alp,pkd-skip",
        "--output",
        str(root / "sweep"),
    ]
    assert main(argv) == 0
    return root / "sweep", argv

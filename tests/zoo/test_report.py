"""``kdplug report`` on two tiny runs: Markdown, HTML, the paper table and the PNG figures, and
the records the figures are drawn from (the pairs each projector compared)."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

from kdplug.cli import main


def figures(markdown: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)


def test_report_writes_markdown_html_and_figures(tiny_sweep, tmp_path, capsys):
    directory, _ = tiny_sweep
    runs = [str(directory / "points" / "projector=alp"), str(directory / "points" / "projector=pkd-skip")]
    out = tmp_path / "report"
    assert main(["report", *runs, "--output", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    # our scores beside the paper's (ALP-KD Table 1, SST-2: 90.37 for ALP)
    assert "alp-kd Table 1" in markdown and "/ 90.37 (accuracy)" in markdown
    drawn = figures(markdown)
    # both runs reproduce the zoo's ALP row with one seed: one method, its figures once
    assert [name.split("-")[0] for name in drawn] == ["curves", "attention", "layers"]
    assert "seed 42 appears twice" in markdown
    for figure in drawn:
        assert (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
        assert f'src="{figure}"' in html


def test_each_method_gets_its_curves_attention_and_pairs(tiny_sweep, tmp_path):
    directory, _ = tiny_sweep
    runs = []
    for name in ("alp", "pkd-skip"):  # the same runs outside the zoo: two methods of one setup
        run = shutil.copytree(directory / "points" / f"projector={name}", tmp_path / name)
        metrics = json.loads((run / "metrics.json").read_text())
        metrics["config"]["zoo"] = None
        (run / "metrics.json").write_text(json.dumps(metrics))
        (run / "config.yaml").write_text(
            (run / "config.yaml").read_text().replace("zoo: alp-kd/table1-sst2-alp", "zoo: null")
        )
        runs.append(str(run))
    out = tmp_path / "report"
    assert main(["report", *runs, "--output", str(out)]) == 0
    drawn = figures((out / "report.md").read_text())
    assert [name.split("-")[0] for name in drawn] == ["curves", "attention", "attention", "layers", "layers"]
    assert drawn == ["curves-1.png", "attention-1-1.png", "attention-1-2.png", "layers-1-1.png", "layers-1-2.png"]


def test_the_recorded_pairs_are_what_each_method_compared(tiny_sweep):
    """PKD compares student layer j with teacher layer A(j); ALP with the attention mix Σ_k α_jk T_k."""
    directory, _ = tiny_sweep
    pkd = directory / "points" / "projector=pkd-skip" / "layers_dev.safetensors"
    with safe_open(str(pkd), framework="numpy") as handle:
        names = json.loads(handle.metadata()["pairs"])
    tensors = load_file(str(pkd))
    assert names == [{"student": "S1", "teacher": "T2"}]  # a 2-layer student of a 4-layer teacher: skip map
    np.testing.assert_array_equal(tensors["pair.0.teacher"], tensors["teacher.2"])
    np.testing.assert_array_equal(tensors["pair.0.student"], tensors["student.1"])
    # its ILD term per example: PKD's eq. 7, ‖s/‖s‖ − t/‖t‖‖² (summed over the vector), from the vectors
    unit = lambda v: v / np.linalg.norm(v, axis=1, keepdims=True)  # noqa: E731
    expected = ((unit(tensors["student.1"]) - unit(tensors["teacher.2"])) ** 2).sum(axis=1)
    np.testing.assert_allclose(tensors["pair.0.loss"], expected, rtol=1e-4, atol=1e-6)

    run = directory / "points" / "projector=alp"
    tensors = load_file(str(run / "layers_dev.safetensors"))
    attention = json.loads((run / "attention.json").read_text())
    alpha = np.asarray(attention["examples"])  # (examples, P, n)
    teacher = np.stack([tensors[f"teacher.{i}"] for i in attention["teacher_layers"]], axis=1)  # (N, n, D)
    mix = np.einsum("en,end->ed", alpha[:, 0], teacher[: len(alpha)])
    np.testing.assert_allclose(tensors["pair.0.teacher"][: len(alpha)], mix, rtol=1e-4, atol=1e-5)
    # ALP's ILD term per example: the MSE of student layer 1 and its mix, averaged over the vector
    expected = ((tensors["pair.0.student"] - tensors["pair.0.teacher"]) ** 2).mean(axis=1)
    np.testing.assert_allclose(tensors["pair.0.loss"], expected, rtol=1e-4, atol=1e-7)


def test_report_skips_missing_figure_data_with_one_note(tiny_sweep, tmp_path, capsys):
    directory, _ = tiny_sweep
    bare = tmp_path / "bare"
    shutil.copytree(directory / "points" / "projector=alp", bare)
    (bare / "attention.json").unlink()
    (bare / "layers_dev.safetensors").unlink()
    out = tmp_path / "report"
    assert main(["report", str(bare), "--output", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert markdown.count("No attention recorded by") == 1 and markdown.count("No compared pairs recorded by") == 1
    assert [name.split("-")[0] for name in figures(markdown)] == ["curves"]


def test_report_rejects_a_directory_without_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--output", str(tmp_path / "out")]) == 2
    assert "not a finished run directory" in capsys.readouterr().err

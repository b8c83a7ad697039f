"""``kdplug report`` on two tiny runs: Markdown, HTML, the paper table and the PNG figures."""

from __future__ import annotations

import shutil

from kdplug.cli import main


def test_report_writes_markdown_html_and_figures(tiny_sweep, tmp_path, capsys):
    directory, _ = tiny_sweep
    runs = [str(directory / "points" / "projector=alp"), str(directory / "points" / "projector=pkd-skip")]
    out = tmp_path / "report"
    assert main(["report", *runs, "--output", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    # our scores beside the paper's (ALP-KD Table 1, SST-2: 90.37 for ALP)
    assert "alp-kd Table 1" in markdown and "/ 90.37 (accuracy)" in markdown
    for figure in ("curves.png", "attention-projector_alp.png", "attention-projector_pkd-skip.png", "layers-sst2.png"):
        assert (out / figure).is_file() and (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
        assert f"({figure})" in markdown and f'src="{figure}"' in html


def test_report_skips_missing_figure_data_with_a_note(tiny_sweep, tmp_path, capsys):
    directory, _ = tiny_sweep
    bare = tmp_path / "bare"
    shutil.copytree(directory / "points" / "projector=alp", bare)
    (bare / "attention.json").unlink()
    (bare / "layers_dev.safetensors").unlink()
    out = tmp_path / "report"
    assert main(["report", str(bare), "--output", str(out)]) == 0
    markdown = (out / "report.md").read_text()
    assert "bare: no attention.json" in markdown and "bare: no layers_dev.safetensors; skipped." in markdown
    assert (out / "curves.png").is_file() and not list(out.glob("attention-*.png"))


def test_report_rejects_a_directory_without_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--output", str(tmp_path / "out")]) == 2
    assert "not a finished run directory" in capsys.readouterr().err

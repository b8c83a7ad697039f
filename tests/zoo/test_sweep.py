"""``kdplug sweep``: grid parsing, one run per point, resuming, sharding and the results table."""

from __future__ import annotations

import json

import pytest

from kdplug.cli import main
from kdplug.errors import ConfigError
from kdplug.sweep import Point, Results, grid_points, parse_grid, parse_shard, point_id
from kdplug.testing import set_args, tiny_run_settings


def test_grid_values_are_yaml_and_keep_bracketed_commas():
    grid = parse_grid(["lr=1e-5,2e-5", "projector_options.layer_map=[1,5,9],[2,6,10]", "seed=1,2"])
    assert grid == {"lr": [1e-5, 2e-5], "projector_options.layer_map": [[1, 5, 9], [2, 6, 10]], "seed": [1, 2]}
    points = grid_points(grid)
    assert len(points) == 8 and points[0] == {"lr": 1e-5, "projector_options.layer_map": [1, 5, 9], "seed": 1}
    assert point_id(points[-1]) == "lr=2e-05,projector.layer_map=_2_6_10_,seed=2"
    with pytest.raises(ConfigError, match="--grid expects KEY=V1,V2"):
        parse_grid(["lr"])
    assert parse_shard("2/3") == (2, 3)
    with pytest.raises(ConfigError, match="between 1 and N"):
        parse_shard("4/3")


def test_seeds_are_averaged_and_the_best_group_marked(tmp_path):
    points = [
        Point(point_id(v), v, tmp_path, score, {})
        for v, score in [
            ({"lr": 1, "seed": 1}, 0.80),
            ({"lr": 1, "seed": 2}, 0.90),
            ({"lr": 2, "seed": 1}, 0.70),
            ({"lr": 2, "seed": 2}, 0.74),
        ]
    ]
    results = Results(["lr", "seed"], "accuracy", "dev", points)
    groups = {g["values"]["lr"]: g for g in results.groups()}
    assert groups[1]["mean"] == pytest.approx(0.85) and groups[1]["std"] == pytest.approx(0.0707107, rel=1e-5)
    assert groups[1]["best"] and not groups[2]["best"]
    assert "| 1 | 1, 2 | 85.00 ± 7.07 | **best** |" in results.markdown()


def test_sweep_runs_every_point_and_tabulates_them(tiny_sweep, capsys):
    directory, argv = tiny_sweep
    results = json.loads((directory / "results.json").read_text())
    assert [p["values"] for p in results["points"]] == [{"projector": "alp"}, {"projector": "pkd-skip"}]
    for point in results["points"]:
        metrics = json.loads((directory / "points" / point["id"] / "metrics.json").read_text())
        assert metrics["config"]["projector"] == point["values"]["projector"]
        assert metrics["config"]["zoo"] == "alp-kd/table1-sst2-alp"
        assert point["score"] == metrics["student"]["dev"]["dev"]["accuracy"]
    # the fine-tuned teacher was trained by the first point and reused by the second
    second = json.loads((directory / "points" / "projector=pkd-skip" / "metrics.json").read_text())
    assert "reused" in second["teacher"]["finetuned"]
    assert sum(g["best"] for g in results["groups"]) == 1
    assert "**best**" in (directory / "results.md").read_text()
    # run again: every point is done already, nothing is retrained
    capsys.readouterr()
    assert main(argv) == 0
    assert capsys.readouterr().out.count("done already, skipped") == 2


def test_sharded_workers_split_the_points(tiny_sweep, capsys, tmp_path):
    _, argv = tiny_sweep
    assert argv[-4:-2] == ["--grid", "projector=alp,pkd-skip"]
    code = main([*argv[:-4], "--grid", "seed=1,2,3", "--output", str(tmp_path / "other"), "--shard", "3/3"])
    assert code == 0
    assert "3 points, this worker runs 1 (shard 3/3)" in capsys.readouterr().out
    results = json.loads((tmp_path / "other" / "results.json").read_text())
    assert [p["values"] for p in results["points"]] == [{"seed": 3}]
    assert results["pending"] == ["seed=1", "seed=2"]


def test_a_different_grid_in_the_same_directory_is_refused(tiny_sweep, capsys):
    directory, argv = tiny_sweep
    code = main([*argv[:-4], "--grid", "projector=alp,ckd-no", "--output", str(directory)])
    assert code == 2 and "holds another sweep" in capsys.readouterr().err


def test_a_stop_request_ends_the_sweep_and_the_next_run_continues_it(tmp_path, tiny_bert_dir, monkeypatch, capsys):
    from tests.conftest import write_sst2

    data = write_sst2(tmp_path / "SST-2")
    tiny = tiny_run_settings(teacher=tiny_bert_dir, data_dir=data, task="sst2", projector=None, epochs=2)
    argv = [
        "sweep",
        *set_args(tiny),
        "--grid",
        "projector=rkd,nkd",
        "--output",
        str(tmp_path / "sweep"),
    ]
    # SIGTERM right after the first distillation step of the first point
    monkeypatch.setenv("KDPLUG_SIGNAL_AT", "distill:1:1:SIGTERM")
    assert main(argv) == 143
    first = tmp_path / "sweep" / "points" / "projector=rkd"
    assert (first / "checkpoints" / "distill").is_dir()
    assert not (tmp_path / "sweep" / "points" / "projector=nkd").exists()  # the sweep stopped there
    monkeypatch.delenv("KDPLUG_SIGNAL_AT")
    capsys.readouterr()
    assert main(argv) == 0
    assert "resuming at epoch 1, step 1" in (first / "log.txt").read_text()
    results = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert len(results["points"]) == 2 and not results.get("failures")


def test_a_submitit_sweep_warms_one_teacher_then_runs_its_points_as_jobs(tmp_path, tiny_bert_dir, capsys):
    """submitit's local executor: real job processes, the same code path as SLURM's."""
    pytest.importorskip("submitit")
    from tests.conftest import write_sst2
    from tests.zoo.conftest import tiny_overrides

    cache = tmp_path / "cache"
    argv = [
        "sweep",
        "--zoo",
        "alp-kd/table1-sst2-alp",
        *tiny_overrides(tiny_bert_dir, write_sst2(tmp_path / "SST-2")),
        "--set",
        "student=bert-2",
        "--set",
        f"cache_dir={cache}",
        "--grid",
        "projector=alp,pkd-skip",
        "--output",
        str(tmp_path / "sweep"),
        "--launcher",
        "submitit",
        "--cluster",
        "local",
        "--jobs",
        "2",
    ]
    assert main(argv) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "2 points to run as 2 local jobs" in out and "1 teacher(s) fine-tuned or found" in out

    # the teacher was fine-tuned once, by the warm-up job; both point jobs reused it and its outputs
    assert len(list((cache / "teachers").glob("*/model.safetensors"))) == 1
    results = json.loads((tmp_path / "sweep" / "results.json").read_text())
    assert sorted(p["id"] for p in results["points"]) == ["projector=alp", "projector=pkd-skip"]
    for point in results["points"]:
        run = tmp_path / "sweep" / "points" / point["id"]
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["status"] == "completed" and "reused" in metrics["teacher"]["finetuned"]
        assert "building the teacher cache" not in (run / "log.txt").read_text()
    # two jobs ran, each in its own process, each logging its own point
    logs = [path.read_text() for path in (tmp_path / "sweep" / "submitit").rglob("*_log.out")]
    assert sum("[1/1] projector=" in log for log in logs) == 2

    # again: nothing left to submit
    assert main(argv) == 0 and "every point is done already" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--launcher", "submitit", "--cluster", "local", "--executor", "slurm_partitionx=gpu"], "Unknown argument"),
        (["--launcher", "submitit", "--shard", "1/2"], "--shard is for workers you start yourself"),
        (["--jobs", "2"], "add --launcher submitit"),
        (["--launcher", "submitit", "--cluster", "slurm"], "srun"),
    ],
)
def test_bad_launcher_options_exit_2_before_any_work(tmp_path, capsys, extra, message):
    pytest.importorskip("submitit")
    code = main(["sweep", "--grid", "lr=1e-3,2e-3", "--output", str(tmp_path / "sweep"), *extra])
    assert code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "sweep" / "points").exists()


def test_prepare_teachers_fine_tunes_and_caches_then_stops(tmp_path, tiny_bert_dir, capsys):
    from tests.conftest import write_sst2
    from tests.zoo.conftest import tiny_overrides

    cache = tmp_path / "cache"
    argv = [
        "sweep",
        "--zoo",
        "alp-kd/table1-sst2-alp",
        *tiny_overrides(tiny_bert_dir, write_sst2(tmp_path / "SST-2")),
        "--set",
        "student=bert-2",
        "--set",
        f"cache_dir={cache}",
        "--grid",
        "projector=alp,pkd-skip",
        "--grid",
        "seed=1,2",
        "--output",
        str(tmp_path / "sweep"),
    ]
    assert main([*argv, "--prepare-teachers"]) == 0
    assert "1 teacher(s) fine-tuned or found" in capsys.readouterr().out
    assert len(list((cache / "teachers").glob("*/model.safetensors"))) == 1  # four points, one teacher
    # logits and layer vectors (alp and pkd-skip read them) on train and dev
    assert len([p for p in (cache / "teacher-cache").iterdir() if p.is_dir()]) == 4
    assert not (tmp_path / "sweep" / "points").exists()
    # a worker then only reads them
    assert main([*argv, "--shard", "1/4"]) == 0
    [point] = list((tmp_path / "sweep" / "points").iterdir())
    assert "reused" in json.loads((point / "metrics.json").read_text())["teacher"]["finetuned"]
    assert "building the teacher cache" not in (point / "log.txt").read_text()


def test_a_run_written_before_a_new_key_existed_is_the_same_configuration(tmp_path):
    """A finished --seeds or sweep directory from an earlier version lacks keys added since (written
    as null now): running the same command again skips it rather than asking for --overwrite."""
    import yaml

    from kdplug.config import RunConfig, dump_yaml
    from kdplug.sweep import same_config

    config = RunConfig(task="sst2", student="bilstm", projector="rkd", lr=1e-3)
    written = yaml.safe_load(dump_yaml(config))
    assert written["min_epochs"] is None
    del written["min_epochs"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(written))
    assert same_config(tmp_path, config)
    assert not same_config(tmp_path, RunConfig(task="sst2", student="bilstm", projector="rkd", lr=2e-3))
    assert not same_config(tmp_path, RunConfig(task="sst2", student="bilstm", projector="rkd", lr=1e-3, min_epochs=5))

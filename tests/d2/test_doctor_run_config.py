"""The doctor takes a run's ``output_dir/config.yaml`` (read as data, as winpos-eval and winpos-predict read it) and
says what it says for the LazyConfig the run was made from; a preset needs no detectron2 on the command line."""
import sys

from tests.conftest import require

CONFIG = "shapes/mask_rcnn_hieradet_toy_abswin.py"


def _saved_config(tmp_path, overrides=()):
    """``config.yaml`` as winpos-train writes it (detectron2's LazyConfig.save of the loaded config)."""
    lazy = require("detectron2.config").LazyConfig
    from winpos.d2.config import load_config

    path = tmp_path / "run" / "config.yaml"
    path.parent.mkdir(parents=True)
    lazy.save(load_config(CONFIG, list(overrides)), str(path))
    return path


def test_doctor_reads_a_runs_config_yaml_as_its_lazyconfig(tmp_path):
    from winpos.d2.doctor import diagnose

    for overrides in ((), ("model.backbone.bottom_up.recipe=paper",)):
        saved = diagnose(str(_saved_config(tmp_path / str(len(overrides)), overrides)))
        source = diagnose(CONFIG, overrides=overrides)
        assert (saved.ok, saved.image_size, saved.window_sizes) == (source.ok, source.image_size,
                                                                     source.window_sizes)
        body = lambda r: r.text().splitlines()[1:]  # noqa: E731 - the first line names the target
        assert body(saved) == body(source) and "hieradet_toy" in saved.text()


def test_doctor_command_on_a_config_yaml_and_a_missing_one(tmp_path, capsys):
    from winpos.cli.posemb_viz import main

    path = _saved_config(tmp_path)
    status = main(["doctor", str(path)])
    out, err = capsys.readouterr()
    assert status in (0, 1) and "error:" not in err and str(path) in out, err
    assert main(["doctor", str(tmp_path / "nope" / "config.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_preset_doctor_imports_no_detectron2():
    """``winpos-posemb doctor PRESET`` goes through ``diagnose_presets``, not the d2 layer."""
    import subprocess

    code = ("import sys\nfrom winpos.cli.posemb_viz import main\nstatus = main(['doctor', 'vitdet_toy'])\n"
            "print('d2', any(m.split('.')[0] == 'detectron2' for m in sys.modules), status)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-1] in ("d2 False 0", "d2 False 1"), res.stdout[-1000:]

"""The demo's front: argument checks happen before any training, and the combined sweep plot draws every run."""
import pytest

from winpos.d2.demo import CONFIGS, DATASETS, run_demo
from winpos.d2.evaluate import plot_sweeps


@pytest.mark.parametrize("kwargs,message", [
    ({"encodings": ("abswin", "absolute")}, "unknown encoding 'absolute'"),
    ({"dataset": "coco"}, "unknown demo dataset 'coco'"),
])
def test_bad_demo_arguments_fail_before_training(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        run_demo(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


def test_every_demo_encoding_has_a_config_and_datasets_are_known():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert all((root / c).is_file() for c in CONFIGS.values())
    assert "model.roi_heads.num_classes=1" in DATASETS["shapes1"] and DATASETS["shapes"] == []


def test_plot_sweeps_draws_one_line_per_run(tmp_path, monkeypatch):
    import matplotlib.axes

    drawn = []
    original = matplotlib.axes.Axes.plot
    monkeypatch.setattr(matplotlib.axes.Axes, "plot", lambda self, *a, **k: drawn.append(k["label"]) or original(self, *a, **k))
    res = lambda ap: {"bbox": {"AP": ap}, "segm": {"AP": ap / 2}}  # noqa: E731
    runs = {"abswin": {"192": res(3.0), "256": res(6.0)}, "abs": {"192": res(1.0), "256": res(6.0)}}
    plot_sweeps(runs, str(tmp_path / "sweep.png"), train_size=256)
    assert drawn == ["abswin", "abs", "abswin", "abs"]  # bbox panel, then segm panel
    assert (tmp_path / "sweep.png").stat().st_size > 5000

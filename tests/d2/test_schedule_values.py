"""Schedule values that cannot run are refused in one line before any process starts or any folder is made
(third audit, V04-V12): before, a zero period was a ZeroDivisionError inside fvcore / detectron2, ``max_to_keep=0`` a
bare AssertionError, a NaN or negative lr torch's traceback, and ``max_iter`` 0 or negative exited 0 having trained
and evaluated nothing. Also the ``--dataset`` json with images and no annotations (O05), named as such."""
import json

import pytest

import winpos.d2  # noqa: F401 - registrations
from tests.bad_inputs_helpers import ROOT, assert_one_line_error, tool
from winpos.d2.config import load_config
from winpos.errors import WinposError

CONFIG = ROOT / "configs" / "shapes" / "reproduce_hieradet.py"


@pytest.mark.parametrize("override,message", [
    ("train.max_iter=0", "train.max_iter=0 must be an integer >= 1"),
    ("train.max_iter=-3", "train.max_iter=-3 must be an integer >= 1"),
    ("train.checkpointer.period=0", "train.checkpointer.period=0 must be an integer >= 1"),
    ("train.log_period=0", "train.log_period=0 must be an integer >= 1"),
    ("train.checkpointer.max_to_keep=0", "train.checkpointer.max_to_keep=0 must be an integer >= 1"),
    ("optimizer.lr=nan", "optimizer.lr=nan must be a finite number > 0"),
    ("optimizer.lr=-1.0", "optimizer.lr=-1.0 must be a finite number > 0"),
])
def test_a_schedule_value_that_cannot_run_is_refused(override, message):
    from winpos.d2.startup import check_schedule

    with pytest.raises(WinposError, match=message.replace(".", "\\.").replace("(", "\\(")):
        check_schedule(load_config(CONFIG, [override]))


def test_train_net_refuses_a_zero_checkpoint_period_before_making_the_folder(tmp_path):
    res = tool("train_net.py", "--config-file", CONFIG, f"train.output_dir={tmp_path / 'run'}", "train.device=cpu",
               "train.checkpointer.period=0")
    assert_one_line_error(res, "train.checkpointer.period=0 must be an integer >= 1")
    assert not (tmp_path / "run").exists()


def test_a_dataset_json_without_annotations_is_named_as_such(tmp_path):
    from winpos.d2.engine import register_cli_datasets
    from winpos.data.shapes import generate_shapes

    ann = generate_shapes(tmp_path, "val", 2, image_size=64, seed=3, max_objects=2)
    data = json.loads(ann.read_text())
    data["annotations"] = []
    ann.write_text(json.dumps(data))
    with pytest.raises(WinposError, match="instances_val.json lists 2 images and no annotations; a dataset to train"):
        register_cli_datasets([f"noann={ann}:{tmp_path / 'val'}"])

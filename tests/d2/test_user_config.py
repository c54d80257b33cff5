"""A user's LazyConfig composed as docs/recipes.md ("Your own config") shows saves a clean ``config.yaml``: the run's
saved config has only the shipped config's keys and is the shipped config with the same change, byte for byte.
The same file with the loaded config under a plain name (``base = get_config(...)``) shows why the doc says ``_``:
detectron2's ``LazyConfig.load`` makes that name a key, a second copy of the whole config."""
import re
from pathlib import Path

from winpos.d2.config import load_config
from winpos.d2.engine import save_config
from winpos.d2.safe_config import load_yaml_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = "COCO/mask_rcnn_hieradet_b_100ep.py"
CHANGE = "model.backbone.bottom_up.recipe=paper"  # what the documented file changes


def documented_user_config() -> str:
    text = (ROOT / "docs" / "recipes.md").read_text()
    section = re.search(r"^## Your own config\n(.*?)^## ", text, re.S | re.M)
    assert section, "docs/recipes.md has no '## Your own config' section"
    code = re.search(r"```python\n(.*?)```", section.group(1), re.S)
    assert code, "the 'Your own config' section has no python block"
    return code.group(1)


def saved_config(cfg, folder: Path) -> str:
    """The run's config.yaml for ``cfg``, written as training writes it (its output_dir shown as OUT)."""
    folder.mkdir()
    cfg.train.output_dir = str(folder)
    assert save_config(cfg) == str(folder / "config.yaml")
    return (folder / "config.yaml").read_text().replace(str(folder), "OUT")


def top_keys(yaml_text: str) -> list[str]:
    return re.findall(r"^([A-Za-z_]\w*):", yaml_text, re.M)


def test_the_documented_composition_saves_the_shipped_config_and_nothing_else(tmp_path):
    code = documented_user_config()
    assert SHIPPED in code and "_base = get_config(" in code
    user = tmp_path / "my_config.py"
    user.write_text(code)
    mine = saved_config(load_config(user), tmp_path / "mine")
    shipped = saved_config(load_config(SHIPPED, [CHANGE]), tmp_path / "shipped")
    assert top_keys(mine) == top_keys(shipped) == ["dataloader", "lr_multiplier", "model", "optimizer", "train"]
    assert mine == shipped  # the same model, data, optimizer and schedule, and the documented change applied
    assert "recipe: paper" in mine
    assert sorted(load_yaml_config(tmp_path / "mine" / "config.yaml")) == top_keys(shipped)  # reloads as data

    # the reason for the "_": the same file with a plain name saves the loaded config a second time under it
    plain = tmp_path / "plain_config.py"
    plain.write_text(code.replace("_base", "base"))
    stray = saved_config(load_config(plain), tmp_path / "plain")
    assert top_keys(stray) == ["base"] + top_keys(shipped)
    assert len(stray.splitlines()) > 1.9 * len(shipped.splitlines())

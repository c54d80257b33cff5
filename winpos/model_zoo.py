"""winpos's LazyConfigs and the demo's checkpoint by name, in a checkout and in an installed package alike.

The configs are the repository's ``configs/`` folder; the package installs it as ``winpos/configs`` (one source,
no copy). A name is a path inside that folder::

    from winpos.model_zoo import get_config, list_configs
    cfg = get_config("COCO/mask_rcnn_vitdet_b_100ep.py")          # a whole detector recipe
    model = get_config("common/models/mask_rcnn_vitdet.py").model  # a piece, inside a user's own LazyConfig

Every command's ``--config-file`` takes such a name as well as a file path (a file that exists wins).
``demo_checkpoint()`` is the stage-1 detector the demo starts from, shipped with the package.
"""
from __future__ import annotations

import os

from winpos.utils.config_names import DEMO_CHECKPOINT, config_path, config_root, demo_checkpoint, docs_root, list_configs

__all__ = ["config_root", "config_path", "list_configs", "get_config", "demo_checkpoint", "docs_root", "DEMO_CHECKPOINT"]


def get_config(name: str | os.PathLike, overrides=()):
    """The LazyConfig ``name`` (see ``config_path``) loaded with strict ``key=value`` ``overrides``
    (``winpos.d2.config.load_config``); needs detectron2 (``pip install 'winpos[d2]'`` plus detectron2)."""
    from winpos.d2.config import load_config

    return load_config(config_path(name), overrides)

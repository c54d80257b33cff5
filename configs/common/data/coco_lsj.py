from omegaconf import OmegaConf

from detectron2.config import LazyCall as L
from detectron2.data import build_detection_test_loader

from winpos.d2.data import build_lsj_mapper, build_resumable_train_loader, build_test_mapper, get_dataset_dicts
from winpos.d2.evaluate import build_coco_evaluator

# ViTDet's large-scale jitter at 1024 px (flip, resize x0.1-2.0, crop 1024, no pad), RGB, batch 64; test:
# long side 1024. The train stream is seeded and resumable (winpos.d2.data).
dataloader = OmegaConf.create()
dataloader.train = L(build_resumable_train_loader)(
    dataset=L(get_dataset_dicts)(names="coco_2017_train"),
    mapper=L(build_lsj_mapper)(is_train=True, image_size=1024, min_scale=0.1, max_scale=2.0,
                               use_instance_mask=True, image_format="RGB"),
    total_batch_size=64,
    num_workers=4,
    seed="${...train.seed}",
)
dataloader.test = L(build_detection_test_loader)(
    dataset=L(get_dataset_dicts)(names="coco_2017_val", filter_empty=False, shapes=None),
    mapper=L(build_test_mapper)(image_size=1024, image_format="RGB"),
    num_workers=4,
)
# the evaluator scores against the images the test loader read: the same names and, for the embedded shapes data,
# the same generator parameters (an evaluator registering the names from other parameters would hold other images)
dataloader.evaluator = L(build_coco_evaluator)(dataset_name="${..test.dataset.names}", use_fast_impl=False,
                                               shapes="${..test.dataset.shapes}")

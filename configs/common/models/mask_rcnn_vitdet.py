# Mask R-CNN with ViTDet-B under detectron2's SimpleFeaturePyramid (p2-p6 from the stride-16 map), batches
# padded to 1024x1024 (LSJ). Same heads as detectron2's ViTDet recipe.
from detectron2.config import LazyCall as L
from detectron2.modeling import SimpleFeaturePyramid
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from winpos.d2.backbone import ViTDetBackbone

from .mask_rcnn_fpn import model

model.backbone = L(SimpleFeaturePyramid)(
    net=L(ViTDetBackbone)(
        net="vitdet_b",  # a winpos preset: vitdet_{b,l,h} or vitdet_toy
        recipe="original",  # original (abs + relpos, detectron2) | paper | rope | lookhere
        out_feature="last_feat",
        img_size=1024,  # sizes the relpos tables of global blocks
        drop_path_rate=0.1,
    ),
    in_feature="${.net.out_feature}",
    out_channels=256,
    scale_factors=(4.0, 2.0, 1.0, 0.5),
    top_block=L(LastLevelMaxPool)(),
    norm="LN",
    square_pad=1024,
)

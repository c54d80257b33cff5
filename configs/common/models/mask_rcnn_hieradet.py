# Mask R-CNN with HieraDet-B as the bottom-up of detectron2's FPN (MViTv2's recipe): scale2..scale5 at strides
# 4-32, each LayerNorm-ed, FPN with LayerNorm and a max-pooled p6, batches padded to 1024x1024 (LSJ).
from detectron2.config import LazyCall as L
from detectron2.modeling import FPN
from detectron2.modeling.backbone.fpn import LastLevelMaxPool

from winpos.d2.backbone import HieraDetBackbone

from .mask_rcnn_fpn import model

model.backbone = L(FPN)(
    bottom_up=L(HieraDetBackbone)(
        net="hieradet_b",  # a winpos preset: hieradet_{t,s,b,bplus,l,h} or hieradet_toy
        recipe="original",  # original (SAM2 abs-win) | paper | rope | lookhere
        out_features=("scale2", "scale3", "scale4", "scale5"),
        img_size=1024,  # sizes the relpos tables of global blocks
        drop_path_rate=0.2,
    ),
    in_features="${.bottom_up.out_features}",
    out_channels=256,
    norm="LN",
    top_block=L(LastLevelMaxPool)(),
    square_pad=1024,
)

"""Stage 1a of ``winpos.d2.reproduce`` (optional, ``--mim-iters``): masked-token pretraining of the detector's
HieraDet on the 64 px shapes images, with mask units equal to the stage-1 windows as in Hiera's MAE."""
from __future__ import annotations

import logging
import time

import torch

from winpos.d2.reproduce import WINDOW, build_cfg

logger = logging.getLogger(__name__)


class MaskedTokenDecoder(torch.nn.Module):
    """Light pixel decoder for masked-token pretraining: each stage output ``(B, h, w, C_i)`` -> a linear to
    ``dim``, upsampled to the stride-4 grid and summed, -> GELU -> the ``4 x 4 x 3`` pixels of each token."""

    def __init__(self, channels, dim=96, patch=4):
        import torch.nn as nn

        super().__init__()
        self.lateral = nn.ModuleList(nn.Linear(c, dim) for c in channels)
        self.head = nn.Sequential(nn.GELU(), nn.Linear(dim, patch * patch * 3))

    def forward(self, stages, hw):
        import torch.nn.functional as F

        out = 0
        for lat, x in zip(self.lateral, stages):
            y = lat(x).permute(0, 3, 1, 2)  # (B, h, w, C) -> (B, dim, h, w)
            out = out + F.interpolate(y, size=hw, mode="nearest")
        return self.head(out.permute(0, 2, 3, 1))  # (B, H, W, 48)


def _masked_forward(net, images, mask, mask_token):
    """HieraDet forward with the tokens where ``mask (B, H, W)`` is True replaced by ``mask_token`` before the
    position embedding is added (SimMIM); returns the four stage outputs ``(B, h_i, w_i, C_i)``."""
    import torch

    x = net.patch_embed(images)  # (B, H, W, C)
    x = torch.where(mask[..., None], mask_token.to(x.dtype), x)
    if net.pos_embed is not None:
        x = x + net.pos_embed(tuple(x.shape[1:3]))
    outs = []
    for i, blk in enumerate(net.blocks):
        x = blk(x)
        if i in net.stage_ends:
            outs.append(x)
    return outs


def pretrain_masked(spec: dict, iters: int, dst: str, batch: int = 32, ratio: float = 0.5, lr: float = 1.5e-3,
                    pos_lr_mult: float = 1.0) -> dict:
    """Stage 1a: masked-token pretraining of the detector's HieraDet on the 64 px shapes images.

    Mask units are the stage-1 windows (4x4 tokens, 16 px), as in Hiera's MAE: about ``ratio`` of them are
    blanked in the image and their tokens replaced by a learned mask token, and the pixels of every masked token
    (normalized per token, as MAE's ``norm_pix_loss``) are regressed from all four stages. Inside a masked
    window the tokens differ only by their position, so drawing a unit's 16 tokens asks for within-window
    position, which an absolute embedding under weight-shared window attention gives by repeating the same
    pattern in every window: the structure Hiera's MAE embedding learns. Writes the whole detector (heads untrained) to ``dst``.
    """
    import numpy as np
    import torch
    import torch.nn.functional as F
    from detectron2.data import DatasetCatalog
    from PIL import Image

    from winpos.d2.data import ensure_registered
    from winpos.d2.engine import build_model
    from winpos.outputs import atomic_write

    cfg = build_cfg(spec)
    torch.manual_seed(spec["seed"])
    model = build_model(cfg)
    net = model.backbone.bottom_up.net
    ensure_registered(["shapes1_train"], dict(spec["shapes"]))
    files = [d["file_name"] for d in DatasetCatalog.get("shapes1_train")]
    imgs = torch.from_numpy(np.stack([np.asarray(Image.open(f).convert("RGB")) for f in files]))  # (N, H, W, 3)
    mean = torch.tensor(cfg.model.pixel_mean).view(1, 3, 1, 1)
    std = torch.tensor(cfg.model.pixel_std).view(1, 3, 1, 1)
    decoder = MaskedTokenDecoder(net.channels)
    mask_token = torch.nn.Parameter(torch.zeros(1, 1, 1, net.channels[0]))
    pos = [p for n, p in net.named_parameters() if n.startswith("pos_embed.")]
    rest = [p for n, p in net.named_parameters() if not n.startswith("pos_embed.")]
    opt = torch.optim.AdamW([{"params": rest + list(decoder.parameters()) + [mask_token], "mult": 1.0},
                             {"params": pos, "mult": pos_lr_mult, "weight_decay": 0.0}],
                            lr=lr, weight_decay=0.05, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(spec["seed"])
    losses = []
    t0 = time.time()
    for it in range(iters):
        for g in opt.param_groups:  # linear warmup, cosine decay
            g["lr"] = g["mult"] * lr * min(1.0, (it + 1) / 100) * 0.5 * (1 + np.cos(np.pi * it / iters))
        idx = torch.randint(len(imgs), (batch,), generator=gen)
        x = imgs[idx].permute(0, 3, 1, 2).float()  # (B, 3, H, W)
        flip = torch.rand(batch, generator=gen) < 0.5
        x[flip] = x[flip].flip(-1)
        x = (x - mean) / std
        B, _, H, W = x.shape
        h, w = H // 4, W // 4
        u = WINDOW  # mask units = the stage-1 windows, as Hiera's MAE
        mask = (torch.rand(B, h // u, w // u, generator=gen) < ratio).repeat_interleave(u, 1).repeat_interleave(u, 2)
        target = F.unfold(x, 4, stride=4).transpose(1, 2).reshape(B, h, w, 48)
        # blank the masked pixels too: the 7x7 stride-4 patch embedding of a visible neighbour would see them
        x = x * ~mask.repeat_interleave(4, 1).repeat_interleave(4, 2)[:, None]
        stages = _masked_forward(net, x, mask, mask_token)
        pred = decoder(stages, (h, w))  # (B, h, w, 48)
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
        loss = ((pred - target) ** 2).mean(-1)[mask].mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if (it + 1) % 100 == 0:
            ws = ""
            if net.pos_embed is not None and hasattr(net.pos_embed, "pos_embed"):
                from winpos.diagnostics.metrics import window_similarity

                g = int(net.pos_embed.pos_embed.shape[1] ** 0.5)
                E = net.pos_embed.pos_embed.detach().reshape(g, g, -1).permute(2, 0, 1)
                ws = f", embedding WS@{WINDOW} {window_similarity(E, WINDOW, centred=True):.2f}"
            logger.info(f"masked-token pretraining {it + 1}/{iters}: loss {np.mean(losses[-100:]):.3f}{ws} "
                        f"({time.time() - t0:.0f} s)")
    atomic_write(dst, lambda f: torch.save({"model": model.state_dict()}, f), "wb")
    return {"loss_first100": float(np.mean(losses[:100])), "loss_last100": float(np.mean(losses[-100:])),
            "seconds": time.time() - t0}

"""The ViTDet half of "Window Attention is Bugged" at CPU scale (``tools/reproduce.py --vitdet``).

ViTDet pretrains (MAE) with global attention and MAE's *fixed* 2-D sin-cos embedding, and adds windows only for
detection: the embedding is interpolated from the pretraining grid to the detection grid, so each window sees a
stretched piece of it instead of the whole grid it was pretrained with. The paper tiles the pretrained grid per
window instead (abs-win) and drops most relative position biases, for the same AP at lower cost.

Here: the CPU-sized ViTDet (``vitdet_toy``: 96 channels, 4 blocks, blocks 1 and 3 global, patch 16) in a Mask
R-CNN on the one-class shapes data at 256 px (16x16 tokens, 8x8-token windows). The embedding is MAE's 2-D sin-cos
table for an 8x8 grid (MAE at 128 px: one window), converted by ``winpos.checkpoints.load_external`` as it would
convert an MAE checkpoint. Rows, all from the same trunk initialisation per seed (only the position parts differ):

* (A) ``abs``: the sin-cos grid interpolated to 16x16, learnable; no relative position bias;
* (B) ``abs_relpos``: the same plus relpos in every block (detectron2's original ViTDet);
* (C) ``abswin``: abs-win, the sin-cos grid tiled per window plus a zero-initialised 8x8 global part; no relpos.

The trunk is *not* MAE-pretrained (that is beyond a CPU budget): only the embedding is MAE's. So this measures what
the three forms cost and what AP each reaches when trained from the same start, not how much of a pretrained
trunk's knowledge each keeps. Speed is measured side by side by ``tools/reproduce.py`` with ``winpos.bench.train``
(the three detectors' training steps interleaved round-robin on one fixed batch; bench sits above this layer).
"""
from __future__ import annotations

from pathlib import Path

from winpos.errors import WinposError

CONFIGS = {"abs": "mask_rcnn_vitdet_toy_abs.py", "abs_relpos": "mask_rcnn_vitdet_toy_abs_relpos.py",
           "abswin": "mask_rcnn_vitdet_toy_abswin.py"}
LABELS = {"abs": "(A) abs interpolated, no relpos", "abs_relpos": "(B) abs interpolated + relpos (detectron2)",
          "abswin": "(C) abs-win (sin-cos tiled), no relpos"}
PAIRS = (("abswin", "abs"), ("abswin", "abs_relpos"), ("abs_relpos", "abs"))
SIZE, PRETRAIN_SIZE, WINDOW, PATCH = 256, 128, 8, 16
SHAPES = dict(image_size=SIZE, train_images=600, val_images=100, min_objects=1, max_objects=6)


def sincos_2d(grid: int, dim: int):
    """MAE's fixed 2-D sin-cos table ``(grid * grid, dim)``, row-major tokens: the first half of the channels
    encodes the column, the second half the row, each as ``[sin(p * w_i), cos(p * w_i)]`` with
    ``w_i = 1 / 10000 ** (i / (dim / 4))``, ``i < dim / 4``."""
    import torch

    if dim % 4:
        raise WinposError(f"a 2-D sin-cos table needs a channel count divisible by 4, got {dim}")
    omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4))
    pos = torch.arange(grid, dtype=torch.float64)
    rows, cols = torch.meshgrid(pos, pos, indexing="ij")

    def one(p):
        out = p.reshape(-1, 1) * omega[None]
        return torch.cat([out.sin(), out.cos()], 1)

    return torch.cat([one(cols), one(rows)], 1).float()


def mae_state(dim: int, grid: int) -> dict:
    """An MAE-layout state dict holding only the embedding: a zero cls row and the sin-cos grid."""
    import torch

    return {"pos_embed": torch.cat([torch.zeros(1, 1, dim), sincos_2d(grid, dim)[None]], 1)}


def build_cfg(spec: dict):
    """The LazyConfig of one ViTDet run from its spec (row, iterations, lr, seed, output folder, init)."""
    from winpos.d2.config import load_config
    from winpos.experiments.protocol import set_run_fields

    cfg = load_config(spec["config"], [])
    net = cfg.model.backbone.net
    net.pretrain_img_size = PRETRAIN_SIZE  # the abs table is stored at 8x8, as the MAE table it came from
    net.pos_global_size = PRETRAIN_SIZE // PATCH
    net.window_size = WINDOW
    for part in (cfg.dataloader.train, cfg.dataloader.test):
        part.dataset.names = part.dataset.names.replace("shapes_", "shapes1_")
        part.dataset.shapes = dict(SHAPES)
    cfg.model.roi_heads.num_classes = 1
    return set_run_fields(cfg, spec, checkpoints=2, warmup=30)


def init_paths(out_dir: str, seed: int) -> dict:
    """``{row: path}`` of the init checkpoints of ``seed`` under ``out_dir`` (made by ``make_inits``)."""
    return {row: str(Path(out_dir) / f"init_{row}_seed{seed}.pth") for row in CONFIGS}


def make_inits(config_dir: str, out_dir: str, seed: int) -> dict:
    """One init checkpoint per row for ``seed``: the same trunk weights in all three (built once, for ``abs``),
    the position parts from the sin-cos MAE table as ``load_external`` converts it for each row's model. Returns
    ``{row: path}``; existing files are kept (their SHA-256 is part of each run's identity)."""
    import torch

    from winpos.checkpoints import load_external
    from winpos.d2.engine import build_model
    from winpos.experiments.checkpoints import _save_model

    paths = init_paths(out_dir, seed)
    if all(Path(p).is_file() for p in paths.values()):
        return paths
    trunk = None
    for row in CONFIGS:  # "abs" first: its trunk is the one every row starts from
        spec = dict(config=str(Path(config_dir) / CONFIGS[row]), iters=1, seed=seed, out="", lr=1e-4)
        torch.manual_seed(seed)
        model = build_model(build_cfg(spec))
        net = model.backbone.net.net  # SimpleFeaturePyramid -> ViTDetBackbone -> ViTDet
        if trunk is None:
            trunk = {k: v for k, v in model.state_dict().items() if "pos_embed" not in k and "rel_pos" not in k}
        state = model.state_dict()
        shared = {k: v for k, v in trunk.items() if k in state and state[k].shape == v.shape}
        if len(shared) != len(trunk):
            raise WinposError(f"the {row} detector does not share the abs detector's trunk "
                              f"({len(trunk) - len(shared)} tensors differ)")
        state.update(shared)
        converted, _ = load_external(mae_state(net.embed_dim, PRETRAIN_SIZE // PATCH), net, format="mae")
        pos = {f"backbone.net.net.{k}": v for k, v in converted.items() if k.startswith("pos_embed.")}
        if not pos:
            raise WinposError(f"converting the sin-cos table for the {row} detector gave no pos_embed tensor")
        state.update(pos)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        _save_model(state, paths[row])
    return paths


def specs(config_dir: str, output_dir: str, seeds, iters: int = 600, lr: float = 4e-4, threads: int = 1) -> list:
    """The run specs (rows x seeds), each naming its init under ``<output_dir>/inits`` (``make_inits`` makes them
    before the runs start)."""
    out = []
    for seed in seeds:
        inits = init_paths(str(Path(output_dir) / "inits"), seed)
        for row in CONFIGS:
            out.append(dict(name=f"vitdet/{row}/seed{seed}", kind="detect", family="vitdet", row=row,
                            config=str(Path(config_dir) / CONFIGS[row]), iters=iters, seed=seed, lr=lr,
                            init=inits[row], threads=threads, out=str(Path(output_dir) / row / f"seed{seed}")))
    return out


def summarize(results: list[dict]) -> dict:
    """Per row the box / mask AP per seed, and the paired differences of ``PAIRS``."""
    from winpos.experiments.stats import paired

    table = {}
    for r in results:
        s = r["spec"]
        cell = table.setdefault(s["row"], {"box": {}, "mask": {}})
        cell["box"][str(s["seed"])] = r["bbox"]["AP"]
        cell["mask"][str(s["seed"])] = r["segm"]["AP"]
    pairs = [{"treatment": t, "baseline": b, "box": paired(table[t]["box"], table[b]["box"]),
              "mask": paired(table[t]["mask"], table[b]["mask"])}
             for t, b in PAIRS if t in table and b in table]
    return {"rows": table, "pairs": pairs}


def format_table(summary: dict, speed: dict | None = None) -> str:
    from winpos.experiments.stats import describe

    lines = ["| row | box AP (mean over seeds) | mask AP | per seed (box) | s / training iteration |",
             "|---|---|---|---|---|"]
    for row, cell in summary["rows"].items():
        box, mask = list(cell["box"].values()), list(cell["mask"].values())
        t = speed.get(row) if speed else None
        lines.append(f"| {LABELS[row]} | {sum(box) / len(box):.1f} | {sum(mask) / len(mask):.1f} | "
                     f"{', '.join(f'{v:.1f}' for v in box)} | {'-' if t is None else f'{t:.3f}'} |")
    lines += ["", "| pair | box AP: mean [95% CI] p (n) | mask AP |", "|---|---|---|"]
    for p in summary["pairs"]:
        lines.append(f"| {LABELS[p['treatment']].split(')')[0]}) - {LABELS[p['baseline']].split(')')[0]}) | "
                     f"{describe(p['box'])} | {describe(p['mask'])} |")
    return "\n".join(lines)

"""The checkpoints of the reproduction (``winpos.d2.reproduce``): the window-periodic start of stage 1, the exact
abs -> abs-win conversion of a stage-1 detector, the window structure of its embedding, and the export of a
stage-1 checkpoint with its manifest (the file the demo ships).
"""
from __future__ import annotations

import json
from pathlib import Path

from winpos.d2.reproduce import PRETRAIN_SIZE, WINDOW, Protocol, build_cfg, stage1_spec
from winpos.errors import WinposError


def convert_abs_to_abswin(src: str, dst: str) -> dict:
    """Write a copy of the stage-1 ``abs`` detector checkpoint ``src`` with its absolute embedding replaced by the
    exact abs-win projection (window part = mean of the 4x4-token tiles, global part = the residual at the
    16x16 grid). At 64 px the converted model computes the same embedding; at a larger grid the window part is
    tiled and only the residual is interpolated. Returns the WS / energy numbers of the split."""
    import torch

    from winpos.diagnostics.metrics import periodic_energy_ratio
    from winpos.outputs import atomic_write
    from winpos.posemb.abswin import abs_to_abswin

    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    sd = dict(ckpt["model"])
    key = "backbone.bottom_up.net.pos_embed.pos_embed"
    if key not in sd:
        raise WinposError(f"{src} has no {key}: it is not a stage-1 checkpoint with an absolute embedding")
    flat = sd.pop(key)
    n, g = flat.shape[1], PRETRAIN_SIZE // 4
    if n != g * g:
        raise WinposError(f"{key} in {src} holds {n} positions, expected {g}x{g}; was it trained at {PRETRAIN_SIZE} px?")
    grid = flat.float().reshape(1, g, g, -1).permute(0, 3, 1, 2)  # fp32 even from an fp16 file
    global_embed, window_embed = abs_to_abswin(grid, WINDOW)
    sd["backbone.bottom_up.net.pos_embed.global_embed"] = global_embed.contiguous()
    sd["backbone.bottom_up.net.pos_embed.window_embed"] = window_embed.contiguous()
    atomic_write(dst, lambda f: torch.save({"model": sd}, f), "wb")
    return {"periodic_energy": periodic_energy_ratio(grid[0], WINDOW)}


def periodic_start(spec: dict, dst: str, window_std: float = 0.1, global_std: float = 0.05) -> dict:
    """Write the freshly initialized detector of ``spec`` with its absolute embedding set to a window-periodic start:
    one random ``4 x 4 x C`` pattern (std ``window_std``) tiled over the 16x16 grid plus a smooth global term (a
    random 4x4 grid, bicubic to 16x16, std ``global_std``); centred WS at 4 tokens about 0.8, like the README's
    planted Hiera example. The scale (0.1) is that of the embedding a detector learns here from the random start."""
    import torch

    from winpos.d2.engine import build_model
    from winpos.outputs import atomic_write
    from winpos.posemb.abswin import tile_to_grid
    from winpos.posemb.interp import resize_grid

    torch.manual_seed(spec["seed"])
    model = build_model(build_cfg(dict(spec, init="")))
    pe = model.backbone.bottom_up.net.pos_embed.pos_embed  # (1, 256, C)
    g, c = PRETRAIN_SIZE // 4, pe.shape[-1]
    gen = torch.Generator().manual_seed(1000 + spec["seed"])
    window = torch.randn(1, c, WINDOW, WINDOW, generator=gen) * window_std
    smooth = resize_grid(torch.randn(1, c, 4, 4, generator=gen), (g, g))
    grid = tile_to_grid(window, (g, g)) + smooth / smooth.std() * global_std  # (1, C, 16, 16)
    with torch.no_grad():
        pe.copy_(grid.permute(0, 2, 3, 1).reshape(1, g * g, c))
    atomic_write(dst, lambda f: torch.save({"model": model.state_dict()}, f), "wb")
    return window_structure(dst)


def embedding_grid(checkpoint: str):
    """The absolute embedding a stage-1 checkpoint adds at its 16x16 grid, ``(C, 16, 16)``, or None."""
    import torch

    from winpos.posemb.abswin import abswin_embedding

    sd = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    g = PRETRAIN_SIZE // 4
    if "backbone.bottom_up.net.pos_embed.pos_embed" in sd:
        return sd["backbone.bottom_up.net.pos_embed.pos_embed"].reshape(g, g, -1).permute(2, 0, 1).float()
    if "backbone.bottom_up.net.pos_embed.window_embed" in sd:
        return abswin_embedding(sd["backbone.bottom_up.net.pos_embed.global_embed"],
                                sd["backbone.bottom_up.net.pos_embed.window_embed"], (g, g))[0].float()
    return None


def window_structure(checkpoint: str) -> dict | None:
    """Centred WS at the 4-token window of a stage-1 embedding at its 16x16 grid (``ws``), and of the embedding the
    model adds at 2x / 4x the grid when it is naively interpolated (``ws_naive_kx``; abs checkpoints) or in abs-win
    form (``ws_abswin_kx``: tiled window part + interpolated global part; for an abs checkpoint, after the exact
    conversion). None for encodings without a token embedding."""
    import torch

    from winpos.diagnostics.metrics import naive_resize, periodic_energy_ratio, window_similarity
    from winpos.posemb.abswin import abs_to_abswin, abswin_embedding

    E = embedding_grid(checkpoint)
    if E is None:
        return None
    g = PRETRAIN_SIZE // 4
    out = {"ws": window_similarity(E, WINDOW, centred=True), "periodic_energy": periodic_energy_ratio(E, WINDOW)}
    sd = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    prefix = "backbone.bottom_up.net.pos_embed."
    if prefix + "window_embed" in sd:
        parts = sd[prefix + "global_embed"].float(), sd[prefix + "window_embed"].float()
    else:
        parts = abs_to_abswin(E[None], WINDOW)
    for k in (2, 4):
        hw = (g * k, g * k)
        if prefix + "pos_embed" in sd:
            out[f"ws_naive_{k}x"] = window_similarity(naive_resize(E, hw), WINDOW, centred=True)
        out[f"ws_abswin_{k}x"] = window_similarity(abswin_embedding(*parts, hw)[0], WINDOW, centred=True)
    return out


def _file_info(path: str) -> dict:
    """Name and SHA-256 of a checkpoint, plus the manifest next to it (``<stem>.json``) when there is one."""
    import hashlib

    info = {"file": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
    manifest = Path(path).with_suffix(".json")
    if manifest.is_file():
        info["manifest"] = json.loads(manifest.read_text())
    return info


def export_stage1(p: Protocol, encoding: str, dst: str, command: str) -> dict:
    """Ship a stage-1 checkpoint: the model weights only, in fp16 (half the size; stage 2 trains in fp32), written
    atomically to ``dst``, with a manifest ``<dst stem>.json`` next to it holding the command that made it, its
    seed and iterations, its SHA-256, its AP at 64 px and the window structure of its embedding."""
    import hashlib

    import torch

    from winpos.outputs import atomic_write

    spec = stage1_spec(p, encoding)
    src = Path(spec["out"]) / "model_final.pth"
    if not src.is_file():
        raise WinposError(f"no stage-1 checkpoint {src} to export; run stage 1 of {encoding} first")
    sd = torch.load(src, map_location="cpu", weights_only=True)["model"]
    half = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    atomic_write(dst, lambda f: torch.save({"model": half}, f), "wb")
    res = Path(spec["out"]) / "result.json"
    ap = json.loads(res.read_text()) if res.is_file() else {}
    manifest = {"file": Path(dst).name, "sha256": hashlib.sha256(Path(dst).read_bytes()).hexdigest(),
                "command": command, "encoding": encoding, "seed": spec["seed"], "iterations": spec["iters"],
                "lr": spec["lr"], "dtype": "float16",
                "continued_from": _file_info(spec["init"]) if p.pretrain_init else None,
                "box_AP_64px": ap.get("bbox", {}).get("AP"), "mask_AP_64px": ap.get("segm", {}).get("AP"),
                "window_structure": window_structure(dst)}
    before = (manifest["continued_from"] or {}).get("manifest", {})
    manifest["iterations_total"] = spec["iters"] + before.get("iterations_total", before.get("iterations", 0))
    atomic_write(str(Path(dst).with_suffix(".json")), lambda f: json.dump(manifest, f, indent=1), "w")
    return manifest

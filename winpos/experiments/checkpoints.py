"""The checkpoints of the reproduction: the stage-0 trunk as a stage-1 init, the planted window-periodic start
(the positive control), the conversions of a stage-1 ``abs`` detector (exact abs-win, the zero-window control, the
recursive form), the window structure of an embedding, and the export of a stage-1 checkpoint with its manifest
(the file the demo ships).
"""
from __future__ import annotations

import json
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments.protocol import EMBED_KEY, GRID, WINDOW, build_cfg

CONVERSIONS = ("abswin", "control", "recursive")


def sha256(path) -> str:
    from winpos.utils.outputs import sha256_file

    return sha256_file(path)


def _load_model(src: str) -> dict:
    import torch

    try:
        ckpt = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same one-line answer
        raise WinposError(f"{src} is not a readable checkpoint ({type(e).__name__}); re-create it") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise WinposError(f"{src} holds no 'model' state dict: it is not a detector checkpoint of the reproduction")
    return dict(ckpt["model"])


def _save_model(sd: dict, dst: str) -> None:
    import torch

    from winpos.utils.outputs import atomic_write

    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(dst, lambda f: torch.save({"model": sd}, f), "wb")


def _abs_grid(sd: dict, src: str):
    key = EMBED_KEY + "pos_embed"
    if key not in sd:
        raise WinposError(f"{src} has no {key}: it is not a stage-1 checkpoint with an absolute embedding")
    flat = sd[key]
    if flat.shape[1] != GRID * GRID:
        raise WinposError(f"{key} in {src} holds {flat.shape[1]} positions, expected {GRID}x{GRID}; was it trained "
                          f"at {GRID * 4} px?")
    return flat.float().reshape(1, GRID, GRID, -1).permute(0, 3, 1, 2)  # (1, C, 16, 16), fp32 even from fp16


def convert(src: str, dst: str, how: str) -> dict:
    """Write a copy of the stage-1 ``abs`` detector ``src`` whose absolute embedding is re-expressed ``how``:

    * ``abswin``: window part = the mean of the 4x4-token tiles (the orthogonal projection onto window-periodic
      maps), global part = the residual at 16x16. The same embedding at 64 px; at a larger grid the window part
      is tiled and only the residual is interpolated.
    * ``control``: global part = the whole embedding, window part = zeros. The same embedding at 64 px and at every
      size the naive one (bicubic of the whole grid), but with the learnable tiled window parameter that
      ``abswin`` also has during finetuning.
    * ``recursive``: the paper's HieraDet form with period 16: the 16x16 embedding (as ``abswin`` parts) is
      tiled with its own period at any size, so every window sees a window of the learned embedding.
    Returns the periodic energy share of the embedding."""
    from winpos.diagnostics.metrics import periodic_energy_ratio
    from winpos.posemb.abswin import abs_to_abswin

    if how not in CONVERSIONS:
        raise WinposError(f"unknown conversion {how!r}; choose from {', '.join(CONVERSIONS)}")
    sd = _load_model(src)
    grid = _abs_grid(sd, src)
    sd.pop(EMBED_KEY + "pos_embed")
    if how == "control":
        import torch

        global_embed, window_embed = grid, torch.zeros(1, grid.shape[1], WINDOW, WINDOW)
    else:
        global_embed, window_embed = abs_to_abswin(grid, WINDOW)
    sd[EMBED_KEY + "global_embed"] = global_embed.contiguous()
    sd[EMBED_KEY + "window_embed"] = window_embed.contiguous()
    _save_model(sd, dst)
    return {"periodic_energy": periodic_energy_ratio(grid[0], WINDOW)}


def stage0_init(spec: dict, trunk_state: dict, dst: str) -> None:
    """A fresh stage-1 detector of ``spec`` whose backbone trunk is the stage-0 backbone ``trunk_state`` (a
    ``HieraDet.state_dict()``); for encodings without a token embedding the stage-0 embedding is left out.
    Written to ``dst`` as the stage-1 init."""
    import torch

    from winpos.d2.engine import build_model

    torch.manual_seed(spec["seed"])
    model = build_model(build_cfg(dict(spec, init="")))
    net = model.backbone.bottom_up.net
    state = {k: v for k, v in trunk_state.items() if not k.startswith("pos_embed.") or net.pos_embed is not None}
    missing, unexpected = net.load_state_dict(state, strict=False)
    new_terms = [k for k in missing if "rel_pos" in k or "lookhere" in k or "rope" in k]
    if unexpected or set(missing) - set(new_terms):
        raise WinposError(f"the stage-0 trunk does not fit the stage-1 {spec['encoding']} backbone: missing "
                          f"{sorted(set(missing) - set(new_terms))[:4]}, unexpected {sorted(unexpected)[:4]}")
    _save_model(model.state_dict(), dst)


def planted_start(spec: dict, dst: str, window_std: float, global_std: float) -> dict:
    """Write the freshly initialised detector of ``spec`` with its absolute embedding set to a *planted*
    window-periodic start: one random ``4 x 4 x C`` pattern (std ``window_std``) tiled over the 16x16 grid plus a
    smooth global term (a random 4x4 grid, bicubic to 16x16, std ``global_std``). The positive control: what the
    bug does to an embedding that certainly has the pattern."""
    import torch

    from winpos.d2.engine import build_model
    from winpos.posemb.abswin import tile_to_grid
    from winpos.posemb.interp import resize_grid

    torch.manual_seed(spec["seed"])
    model = build_model(build_cfg(dict(spec, init="")))
    pe = model.backbone.bottom_up.net.pos_embed.pos_embed  # (1, 256, C)
    c = pe.shape[-1]
    gen = torch.Generator().manual_seed(1000 + spec["seed"])
    window = torch.randn(1, c, WINDOW, WINDOW, generator=gen) * window_std
    smooth = resize_grid(torch.randn(1, c, 4, 4, generator=gen), (GRID, GRID))
    grid = tile_to_grid(window, (GRID, GRID)) + smooth / smooth.std() * global_std  # (1, C, 16, 16)
    with torch.no_grad():
        pe.copy_(grid.permute(0, 2, 3, 1).reshape(1, GRID * GRID, c))
    _save_model(model.state_dict(), dst)
    return window_structure(dst)


def checkpoint_embedding_grid(checkpoint: str):
    """The absolute embedding a stage-1 checkpoint adds at its 16x16 grid, ``(C, 16, 16)``, or None."""
    from winpos.posemb.abswin import abswin_embedding

    sd = _load_model(checkpoint)
    if EMBED_KEY + "pos_embed" in sd:
        return _abs_grid(sd, checkpoint)[0]
    if EMBED_KEY + "window_embed" in sd:
        return abswin_embedding(sd[EMBED_KEY + "global_embed"].float(), sd[EMBED_KEY + "window_embed"].float(),
                                (GRID, GRID))[0]
    return None


def window_structure(checkpoint: str, multipliers=(1.25, 1.5, 2, 4)) -> dict | None:
    """Centred WS at the 4-token window of a stage-1 embedding at its 16x16 grid (``ws``), its periodic energy
    share, and the WS of what the model adds at ``k`` times the grid when naively interpolated (``ws_naive_<k>x``)
    or in exact abs-win form (``ws_abswin_<k>x``). None for encodings without a token embedding."""
    from winpos.diagnostics.metrics import naive_resize, periodic_energy_ratio, window_similarity
    from winpos.posemb.abswin import abs_to_abswin, abswin_embedding

    E = checkpoint_embedding_grid(checkpoint)
    if E is None:
        return None
    out = {"ws": window_similarity(E, WINDOW, centred=True), "periodic_energy": periodic_energy_ratio(E, WINDOW)}
    parts = abs_to_abswin(E[None], WINDOW)
    for k in multipliers:
        g = round(GRID * k)
        out[f"ws_naive_{k:g}x"] = window_similarity(naive_resize(E, (g, g)), WINDOW, centred=True)
        out[f"ws_abswin_{k:g}x"] = window_similarity(abswin_embedding(*parts, (g, g))[0], WINDOW, centred=True)
    return out


def export_stage1(src: str, dst: str, manifest: dict, force: bool = False) -> dict:
    """Ship a stage-1 checkpoint: the model weights only, in fp16 (half the size; stage 2 trains in fp32), written
    atomically to ``dst``, with ``manifest`` (the command, seeds, iterations, AP, stage-0 history...) plus the
    file's SHA-256 and window structure as ``<dst stem>.json``. An existing ``dst`` or manifest is refused unless
    ``force``."""
    import torch

    from winpos.utils.outputs import atomic_write, check_output_file

    man_path = str(Path(dst).with_suffix(".json"))
    for path in (dst, man_path):
        check_output_file(path, force=force, inputs=[src])
    sd = _load_model(src)
    half = {k: v.half() if v.is_floating_point() else v for k, v in sd.items()}
    atomic_write(dst, lambda f: torch.save({"model": half}, f), "wb")
    out = dict(manifest, file=Path(dst).name, sha256=sha256(dst), dtype="float16",
               window_structure=window_structure(dst))
    atomic_write(man_path, lambda f: json.dump(out, f, indent=1), "w")
    return out

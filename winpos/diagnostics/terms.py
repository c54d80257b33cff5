"""The doctor's reading of the block position terms (RoPE, relpos and LookHere) at a new image size.

For each block kind (window blocks and global blocks) it compares what the blocks see at the new size with what
the term was trained on:

* **RoPE**: attention depends only on the rotation of the offset between two tokens, ``angle(p_i) - angle(p_j)``.
  The reference is global attention over the trained grid (RoPE checkpoints are pretrained globally). Per rotation
  slot (one frequency, per head when heads learn their own) it measures the angle range over all token pairs
  and the angle step between neighbouring tokens, at the reference and at the new size, from the module's own
  positions and angles (``RoPE.grid_positions`` / ``grid_angles``), so every coordinate convention is read as it is
  computed. Verdicts:

  - *extrapolation*: offsets reach at least one trained step beyond the trained ones (integer positions on a
    larger grid). Trained offsets up to D put a slot's rotations in ``[-wD, +wD]``, which covers the whole circle
    once ``wD >= pi``; a slot with ``wD < pi`` (a period above 2D) whose range grows meets rotations never seen.
  - *compression* / *stretch*: positions rescaled into the trained grid (normalized coordinates, EVA-02's
    interpolated positions) keep every offset inside the trained range, but the step between neighbours shrinks
    (compression: offsets between trained ones the model never saw) or grows.
  - *aliasing*: a slot turning more than pi per token: one step reads as a smaller turn the other way.

  The reference is the pretraining (global attention over the ``pretrain_img_size`` grid) by default; with a
  trained size given (``trained_px``: a detector finetuned at 1024 px, SAM3's encoder at 1008 px) it is the model's
  own window layout at that size: window blocks against their window, global blocks against the grid there.

* **relpos**: the stored table (length ``2S-1``, offsets ``|d| <= S-1``) is linearly resampled to ``2K-1`` for a
  key extent K; the stretch ``(2K-1)/(2S-1)`` and the offsets beyond the trained ones are reported.

* **LookHere**: nothing is stored per grid; the direction masks and the ``-slope * distance`` penalties are rebuilt
  on the new grid. What changes is how far the keys are: the farthest key distance at the new extent against the
  trained one (the same reference as RoPE's), and the penalties the weakest and the strongest head give there.
  Keys farther than any trained one are a [WARN] (penalties training never produced), as for the other terms.

``position_terms(net, image_size, trained_px)`` returns one ``TermReport`` per (term, block kind);
``winpos.diagnostics.doctor`` prints them and ``winpos.diagnostics.term_plots`` draws them.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from winpos.errors import WinposError

__all__ = ["BlockGroup", "RopeRange", "TermReport", "block_grids", "block_groups", "block_position_state",
           "lookhere_report", "position_terms", "relpos_report", "rope_range", "rope_report", "token_stride",
           "trained_image_px"]

TOL = 1e-4  # relative tolerance on positions and angles (float32 tables)
HALF_TURN = math.pi


@dataclass
class BlockGroup:
    """Blocks of one kind (``"window"`` / ``"global"``) with one position term and one key extent."""

    kind: str
    term: str
    blocks: list
    extent: tuple  # key grid the term covers at the new size: the window, or the block's whole input grid
    trained_extent: tuple  # ... at the trained size (the pretraining: global attention over the trained grid)
    grid: tuple = ()  # the block's whole input grid at the new size (window blocks: what image coordinates span)


@dataclass
class RopeRange:
    """Positions and rotation angles one RoPE module gives the tokens of one grid.

    span: ``(heads, S)`` largest angle between two tokens per rotation slot (radians); step: ``(heads, S)`` angle
    between neighbouring tokens (the larger of one step in y and in x). pos_span / pos_step: ``(2,)`` (y, x) range
    and step of the positions, in the module's position units."""

    grid: tuple
    span: np.ndarray
    step: np.ndarray
    pos_lo: np.ndarray
    pos_hi: np.ndarray
    pos_step: np.ndarray

    @property
    def pos_span(self) -> np.ndarray:
        return self.pos_hi - self.pos_lo


@dataclass
class TermReport:
    """One term on one block kind: ``level`` ``"OK"`` or ``"WARN"``, the lines to print, and the numbers the plots
    draw (``data``)."""

    term: str
    group: BlockGroup
    level: str = "OK"
    lines: list = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def text(self, indent: str = "  ") -> str:
        """``term, kind blocks (i, j, ...): LEVEL`` then one indented line per finding (the model's own verdict is
        the bracketed ``[OK]`` / ``[WARN]`` / ``[BUG]`` of the doctor's first line)."""
        blocks = ", ".join(map(str, self.group.blocks))
        return "\n".join([f"{self.term}, {self.group.kind} blocks ({blocks}): {self.level}"] +
                         [f"{indent}{line}" for line in self.lines])

    def to_dict(self) -> dict:
        """The term as plain JSON values: term, block kind, blocks, the key extent now and at the trained size
        (``[h, w]`` tokens), level, the printed lines and ``summary()``."""
        g = self.group
        return {"term": self.term, "kind": g.kind, "blocks": [int(i) for i in g.blocks],
                "extent": [int(e) for e in g.extent], "trained_extent": [int(e) for e in g.trained_extent],
                "level": self.level, "lines": list(self.lines), "summary": self.summary()}

    def summary(self) -> dict | None:
        """The few numbers of ``data`` a script checks, as floats, ints and lists (no arrays; a ratio that is not
        finite is None); None for a term without numbers. RoPE: positions now and trained, ``offset_ratio`` (how far
        the offsets reach against the trained ones, per the farther axis), ``step_ratio`` (y, x: < 1 compressed,
        > 1 stretched), the slots meeting unseen angles and how much further they turn, the largest angle range and
        per-token step (radians), the aliased slots. relpos: the stored and used table lengths and the stretch.
        LookHere: the farthest key distance now and trained (tokens), their ratio, the weakest and strongest head's
        slope (logits per token of distance)."""
        if self.term == "RoPE" and self.data:
            return _rope_summary(self.data)
        if self.term == "relpos" and self.data:
            return _relpos_summary(self.data)
        if self.term == "LookHere" and self.data:
            far, trained = float(self.data["max_distance"]), float(self.data["trained_max_distance"])
            return {"max_distance": _number(far), "trained_max_distance": _number(trained),
                    "distance_ratio": _number(far / trained) if trained else None,
                    "min_slope": _number(self.data["slopes"][0]), "max_slope": _number(self.data["slopes"][1])}
        return None


def _number(v) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None


def _rope_summary(d: dict) -> dict:
    new, ref, unseen = d["new"], d["ref"], d["new_angles"]

    def positions(r: RopeRange) -> dict:
        return {"lo": [_number(v) for v in r.pos_lo], "hi": [_number(v) for v in r.pos_hi],
                "step": [_number(v) for v in r.pos_step]}

    return {"coords": d["coords"], "heads": int(new.span.shape[0]), "slots": int(new.span.size),
            "positions": positions(new), "trained_positions": positions(ref),
            "extrapolates": bool(d["extrapolates"]), "offset_ratio": _number(np.max(new.pos_span / ref.pos_span)),
            "step_ratio": [_number(v) for v in d["step_ratio"]],
            "unseen_angle_slots": int(unseen.sum()),
            "max_angle_growth": _number(np.max(new.span[unseen] / ref.span[unseen])) if unseen.any() else None,
            "max_angle_rad": _number(new.span.max()), "trained_max_angle_rad": _number(ref.span.max()),
            "max_step_rad": _number(new.step.max()), "trained_max_step_rad": _number(ref.step.max()),
            "aliased_slots": int(d["aliased"].sum())}


def _relpos_summary(d: dict) -> dict:
    return {"stored": [int(v) for v in d["stored"]], "used": [int(v) for v in d["used"]],
            "stretch": [_number(v) for v in d["stretch"]],
            "trained_max_offset": [(int(s) - 1) // 2 for s in d["stored"]],
            "max_offset": [(int(u) - 1) // 2 for u in d["used"]]}


def rope_range(rope, hw) -> RopeRange:
    """The ``RopeRange`` of ``rope`` (``winpos.posemb.rope.RoPE``) on an ``hw`` token grid (both sides >= 2)."""
    H, W = hw
    if H < 2 or W < 2:
        raise WinposError(f"a {H}x{W} grid has no neighbouring tokens on both axes; the RoPE reading needs >= 2x2")
    ang = rope.grid_angles((H, W)).double()
    ang = ang[None] if ang.dim() == 2 else ang  # (heads, N, S)
    pos = rope.grid_positions((H, W)).double()  # (N, 2)
    step = torch.maximum((ang[:, W] - ang[:, 0]).abs(), (ang[:, 1] - ang[:, 0]).abs())
    return RopeRange((H, W), (ang.amax(1) - ang.amin(1)).numpy(), step.numpy(), pos.amin(0).numpy(),
                     pos.amax(0).numpy(), np.array([float(pos[W, 0] - pos[0, 0]), float(pos[1, 1] - pos[0, 1])]))


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-6 else f"{v:.3g}"


def _positions(r: RopeRange) -> str:
    ys, xs = (f"{_fmt(lo)}..{_fmt(hi)}" for lo, hi in zip(r.pos_lo, r.pos_hi))
    step = _fmt(r.pos_step[0]) if abs(r.pos_step[0] - r.pos_step[1]) < 1e-9 else "/".join(map(_fmt, r.pos_step))
    return f"{ys} x {xs} (step {step})" if ys != xs else f"{ys} per axis (step {step})"


def rope_report(rope, group: BlockGroup, reference_note: str) -> TermReport:
    """Compare ``rope`` on ``group.extent`` with ``rope`` on ``group.trained_extent`` (see module doc)."""
    new, ref = rope_range(rope, group.extent), rope_range(rope, group.trained_extent)
    rep = TermReport("RoPE", group)
    slots = new.span.size
    coords = getattr(rope, "coords", "integer")
    where = "window-local positions" if group.kind == "window" else "positions"
    rep.lines.append(f"{where} {_positions(new)}; trained {_positions(ref)} ({reference_note})")
    over = new.pos_span - ref.pos_span  # per axis, in position units
    extrapolates = bool(np.any(over >= ref.pos_step * (1 - TOL)))
    new_angles = extrapolates & (ref.span < HALF_TURN) & (new.span > ref.span * (1 + TOL))
    ratio = new.pos_step / ref.pos_step  # < 1: compression, > 1: stretch
    aliased, aliased_ref = new.step > HALF_TURN * (1 + TOL), ref.step > HALF_TURN * (1 + TOL)
    k = int(new_angles.sum())
    of = f"of {slots} rotation slots" + (f" ({new.span.shape[0]} heads x {new.span.shape[1]})"
                                         if new.span.shape[0] > 1 else "")
    if extrapolates:
        far = float(np.max(new.pos_span / ref.pos_span))
        if k:
            rep.level = "WARN"
            growth = float(np.max(new.span[new_angles] / ref.span[new_angles]))
            rep.lines.append(
                f"EXTRAPOLATES: offsets reach {'/'.join(map(_fmt, new.pos_span))}, trained "
                f"{'/'.join(map(_fmt, ref.pos_span))} (x{far:.3g}); {k} {of} turned less than half a turn over the "
                f"trained offsets and now rotate up to x{growth:.3g} further, into angles never seen in training")
            rep.lines.append("-> finetune at this size, or rescale positions into the trained grid (coords='normalized' "
                             "with ref_hw, EVA-02's convention: compression instead of extrapolation)")
        else:
            rep.lines.append(f"offsets reach x{far:.3g} the trained ones, but every slot turned at least half a turn "
                             "over them: no rotation angle is new")
    elif np.any(np.abs(ratio - 1) > 1e-3):
        rep.level = "WARN"
        if np.all(ratio <= 1 + 1e-3):
            rep.lines.append(f"COMPRESSED: positions are rescaled into the trained range ({coords} coordinates), "
                             f"so neighbouring tokens are x{float(np.max(1 / ratio)):.3g} closer than in training: no "
                             "rotation beyond the trained range, but offsets between trained ones never seen")
            rep.lines.append("-> the rescaling convention's known cost (EVA-02, DINOv3 at detection sizes); finetuning "
                             "at this size adapts the model to the finer steps")
        else:
            rep.lines.append(f"STRETCHED: positions are rescaled ({coords} coordinates) so neighbouring tokens are "
                             f"x{float(np.max(ratio)):.3g} farther apart than in training; offsets stay within the "
                             "trained range")
    else:
        rep.lines.append("within the trained range at the trained step: no rotation the model has not seen")
    top = float(new.step.max())
    if aliased.any():
        fresh = aliased & ~aliased_ref
        if fresh.any():
            rep.level = "WARN"
        rep.lines.append(f"{'ALIASING' if fresh.any() else 'aliasing (as in training)'}: {int(aliased.sum())} {of} "
                         f"turn more than pi per token (up to {top:.3g} rad), so one step reads as a smaller turn "
                         "the other way")
    else:
        rep.lines.append(f"no aliasing: the fastest slot turns {top:.3g} rad per token (< pi)")
    if group.kind == "window" and coords == "integer":
        rep.lines.append("window-local and image coordinates give the same attention here (integer RoPE depends "
                         "only on offsets)")
    elif group.kind == "window" and min(group.grid or (0,)) >= 2 and tuple(group.grid) != tuple(group.extent):
        image_step = rope_range(rope, group.grid).pos_step
        rep.lines.append(f"window-local coordinates matter here ({coords}): image coordinates over the "
                         f"{group.grid[0]}x{group.grid[1]} grid would step {_fmt(float(image_step.max()))} "
                         f"(x{float(np.max(ref.pos_step / image_step)):.3g} closer than trained), window-local "
                         f"{_fmt(float(new.pos_step.max()))}")
    rep.data = {"new": new, "ref": ref, "new_angles": new_angles, "aliased": aliased, "extrapolates": extrapolates,
                "step_ratio": ratio, "coords": coords}
    return rep


def relpos_report(attn, group: BlockGroup, tables=None) -> TermReport:
    """How ``attn``'s stored relpos tables (or ``tables``, a checkpoint's ``(rel_pos_h, rel_pos_w)``) are resampled
    for ``group.extent`` (key grid; queries pooled or not)."""
    rep = TermReport("relpos", group)
    h, w = tables if tables is not None else (attn.rel_pos_h, attn.rel_pos_w)
    stored = (int(h.shape[0]), int(w.shape[0]))
    used = tuple(2 * e - 1 for e in group.extent)
    stretch = tuple(u / s for u, s in zip(used, stored))
    trained = tuple((s - 1) // 2 for s in stored)  # largest trained offset |d|
    new = tuple(max(0, u - s) for u, s in zip(used, stored))
    desc = "x".join(map(str, stored)) if stored[0] != stored[1] else str(stored[0])
    if used == stored:
        rep.lines.append(f"tables {desc} long used as stored (offsets |d| <= {trained[0]}): nothing resampled")
    else:
        rep.level = "WARN"
        s = max(stretch, key=lambda v: abs(math.log(v)))
        u = used[0] if used[0] == used[1] else f"{used[0]}x{used[1]}"
        if s > 1:
            rep.lines.append(
                f"tables STRETCHED {desc} -> {u} (x{s:.3g}, linear): offset d reads the bias learned at about "
                f"d/{s:.3g}; {max(new)} offsets (|d| {max(trained) + 1}..{(max(used) - 1) // 2}) did not exist in "
                "training")
        else:
            rep.lines.append(f"tables SQUEEZED {desc} -> {u} (x{s:.3g}, linear): offset d reads the bias learned at "
                             f"about d/{s:.3g} (x{1 / s:.3g} farther): the learned profile is squeezed into |d| <= "
                             f"{(max(used) - 1) // 2}, neighbouring learned offsets averaged")
    rep.data = {"stored": stored, "used": used, "stretch": stretch}
    return rep


def lookhere_report(modules, group: BlockGroup, reference_note: str) -> TermReport:
    """How far the keys of ``group``'s blocks are at the new extent against the trained one, and the penalties
    (``-slope * distance``, logits) the weakest and strongest head of those blocks (``modules``: their LookHere
    modules) give the farthest key."""
    rep = TermReport("LookHere", group)
    far = math.hypot(group.extent[0] - 1, group.extent[1] - 1)
    trained = math.hypot(group.trained_extent[0] - 1, group.trained_extent[1] - 1)
    slopes = [v for m in modules for v in m.slope_values() if v > 0]
    what = "window" if group.kind == "window" else "grid"
    e = group.extent
    rep.lines.append(f"keys up to {far:.3g} tokens away on the {e[0]}x{e[1]} {what}; trained up to {trained:.3g} "
                     f"({reference_note})")
    if slopes:
        lo, hi = min(slopes), max(slopes)
        pen = f"-{lo * far:.3g} (weakest head) to -{hi * far:.3g} logits (strongest)"
        if far > trained * (1 + TOL):
            rep.level = "WARN"
            rep.lines.append(f"x{far / trained:.3g} FARTHER than trained: the masks and distances are rebuilt on the new "
                             f"grid (nothing interpolated), and the farthest keys get penalties training never gave: "
                             f"{pen}, against -{lo * trained:.3g} to -{hi * trained:.3g} at the trained range "
                             "(LookHere is built to extrapolate; set_global_slope scales every penalty)")
        else:
            rep.lines.append(f"within the trained range: the farthest key gets {pen}, as in training")
    else:
        lo = hi = 0.0
        rep.lines.append("every head has slope 0: no penalty and no mask at any distance")
    rep.data = {"max_distance": far, "trained_max_distance": trained, "slopes": (lo, hi)}
    return rep


def token_stride(net) -> int:
    """Pixels per token of a ViTDet (its patch size) or a HieraDet (its first stage's stride)."""
    return getattr(net, "patch_size", None) or net.strides[0]


def block_grids(net, image_size: int) -> list[int]:
    """The side of the square token grid each block of ``net`` takes at a square ``image_size``: a pooling block
    (``q_stride`` > 1) hands the next ones its grid divided by its stride, rounded up, as in the model."""
    grid, grids = -(-image_size // token_stride(net)), []
    for blk in net.blocks:
        grids.append(grid)
        if blk.attn.q_stride > 1:
            grid = -(-grid // blk.attn.q_stride)
    return grids


def trained_image_px(net) -> tuple[int, str]:
    """The image size (px) the block terms are compared against by default, and where it comes from."""
    stride = token_stride(net)
    pre = getattr(net, "pretrain_hw", None)
    if pre is not None:
        return int(max(pre)) * stride, "pretrain_img_size"
    pe = getattr(net, "pos_embed", None)
    if getattr(pe, "pretrain_hw", None) is not None:
        return int(max(pe.pretrain_hw)) * stride, "the absolute embedding's grid"
    return 224, "assumed: the model does not record its pretraining size"


def block_groups(net, image_size: int, trained_px: int, same_layout: bool = False) -> list[BlockGroup]:
    """The blocks with a RoPE, relpos or LookHere term, grouped by (term, kind, extent), at ``image_size`` px. The
    trained extent of a RoPE or LookHere group is the whole grid at ``trained_px`` (global attention, as their
    pretraining), or with ``same_layout`` the group's own extent at ``trained_px`` (its window, or the grid there)."""
    groups: dict = {}
    grids = zip(block_grids(net, image_size), block_grids(net, trained_px))
    for i, (blk, (side, ref_side)) in enumerate(zip(net.blocks, grids)):
        attn = blk.attn
        term = attn.position.kind
        if term in ("rope", "relpos", "lookhere"):
            grid, ref = (side, side), (ref_side, ref_side)
            ws = attn.window_size
            kind = "window" if ws else "global"
            extent = (ws, ws) if ws else grid
            trained = ((ws, ws) if ws and same_layout else ref) if term != "relpos" else extent
            groups.setdefault((term, kind, extent, trained, grid), []).append(i)
    return [BlockGroup(kind, term, blocks, extent, trained, grid)
            for (term, kind, extent, trained, grid), blocks in groups.items()]


def block_position_state(state: dict, depth: int) -> dict:
    """The position entries of a backbone checkpoint, keyed by block: ``{i: {"freqs" | "rel_pos_h" | "rel_pos_w":
    tensor}}``. Keys are matched by their tail ``blocks.<i>.attn.<name>``, so a detector's checkpoint
    (``backbone.net.blocks...``) reads like the backbone's own."""
    out: dict = {}
    for key, value in state.items():
        m = re.search(r"(?:^|\.)blocks\.(\d+)\.attn\.(?:rope\.)?(freqs|rel_pos_h|rel_pos_w)$", key)
        if m and int(m.group(1)) < depth:
            out.setdefault(int(m.group(1)), {})[m.group(2)] = value
    return out


def _rope_module(attn, freqs=None):
    """The block's RoPE with real values: the module itself, or (built on the meta device) one rebuilt on the CPU
    with the same options: fixed frequencies exact, learned ones from ``freqs`` (a checkpoint's) or else at their
    seeded initialization. Returns (module, whether its frequencies are the trained ones)."""
    from winpos.posemb.rope import RoPE

    source = attn.rope.inv_freq if attn.rope.kind == "axial" else attn.rope.freqs
    if not source.is_meta and freqs is None:
        return attn.rope, True
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("cpu"):
            rope = RoPE(attn.head_dim, attn.num_heads, **attn.position.rope)
    if rope.kind == "axial":
        return rope, True
    if freqs is None:
        return rope, False
    if tuple(freqs.shape) != tuple(rope.freqs.shape):
        raise WinposError(f"the checkpoint's RoPE frequencies have shape {tuple(freqs.shape)}, the model's "
                          f"{tuple(rope.freqs.shape)}; check the preset and recipe the checkpoint was converted to")
    with torch.no_grad():
        rope.freqs.copy_(freqs.float())
    return rope, True


def position_terms(net, image_size: int, trained_px: int | None = None, state: dict | None = None
                   ) -> list[TermReport]:
    """One ``TermReport`` per (term, block kind) of ``net`` (ViTDet or HieraDet) at a square ``image_size``;
    ``trained_px``: the image size the RoPE was trained at (default ``trained_image_px(net)``); ``state``: a
    checkpoint's state dict for ``net`` (learned RoPE frequencies, relpos table lengths), else the model's own."""
    same_layout = trained_px is not None
    if trained_px is None:
        trained_px, source = trained_image_px(net)
        if source == "pretrain_img_size":
            source += "; a term trained in this window layout: --rope-trained-size"
    else:
        source = "the given trained size, this window layout"
    blocks = block_position_state(state, len(net.blocks)) if state is not None else {}
    if state is not None and not any(re.search(r"(?:^|\.)blocks\.\d+\.attn\.", k) for k in state):
        raise WinposError("the checkpoint holds no ViT blocks (blocks.<i>.attn.*): it is not a winpos checkpoint of "
                          "this model; pass the one converted for this preset (winpos-convert --to PRESET)")
    out = []
    for group in block_groups(net, image_size, trained_px, same_layout):
        attn = net.blocks[group.blocks[0]].attn
        if group.term == "relpos":
            mine = blocks.get(group.blocks[0], {})
            tables = (mine["rel_pos_h"], mine["rel_pos_w"]) if "rel_pos_h" in mine and "rel_pos_w" in mine else None
            out.append(relpos_report(attn, group, tables))
            continue
        if any(min(e) < 2 for e in (group.extent, group.trained_extent)):
            continue  # a 1-token extent has no offsets to read
        g = group.trained_extent
        how = "window attention" if same_layout and group.kind == "window" else "global attention"
        note = f"{how} on {g[0]}x{g[1]} tokens at {trained_px} px, {source}"
        if group.term == "lookhere":
            out.append(lookhere_report([net.blocks[i].attn.lookhere for i in group.blocks], group, note))
            continue
        modules = [_rope_module(net.blocks[i].attn, blocks.get(i, {}).get("freqs")) for i in group.blocks]
        if all(exact for _, exact in modules) and attn.rope.kind == "mixed":  # learned per block: the worst one
            reps = [rope_report(rope, group, note) for rope, _ in modules]
            worst = max(range(len(reps)), key=lambda j: (int(reps[j].data["new_angles"].sum()),
                                                          float(reps[j].data["new"].step.max())))
            rep = reps[worst]
            rep.lines.append(f"learned frequencies differ by block: the numbers are block {group.blocks[worst]}'s, "
                             "the one with the most new rotations, then the fastest")
        else:
            rep = rope_report(modules[0][0], group, note)
            if not modules[0][1]:
                rep.lines.append("learned frequencies read at their initialization (" +
                                 ("not in the checkpoint)" if state is not None else "no checkpoint given)"))
        out.append(rep)
    return out

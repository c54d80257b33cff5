"""2D rotary position embedding (RoPE) for vision tokens, applied to q and k before attention.

Two families (Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024):

* ``axial``: fixed frequencies ``w_i = base^(-i/n)``, ``n = R/4``, i < n. Of the ``R/2`` angle slots, one half
  rotates by ``y * w_i`` and the other by ``x * w_i`` (``axis_order`` says which half comes first). With
  ``pairing="interleaved"``, ``axis_order="yx"`` this is timm's ``build_rotary_pos_embed(in_pixels=False,
  grid_indexing='ij')`` / EVA-02; ``axis_order="xy"`` is rope-vit's axial layout.
* ``mixed``: learnable 2D frequency vectors, one ``(f_y, f_x)`` per angle slot (per head or shared); the angle of a
  token at (y, x) is ``y * f_y + x * f_x``. With zero initial rotation it reduces exactly to axial.

Layout contract (shared with ``winpos.attention`` and the Triton kernels): tokens are row-major on an (H, W) grid,
``n = y * W + x``. Angle slot ``j`` (of ``R/2``) rotates the dim pair ``(2j, 2j+1)`` (``"interleaved"``) or
``(j, j + R/2)`` (``"half"``, rotate_half). Only the first ``R = rot_dims`` head dims are rotated; the rest pass
through. cos/sin tables are ``(N, R/2)`` when shared by all heads or ``(heads, N, R/2)`` per head, in float32
(float64 when the module itself was converted to float64, e.g. for gradcheck).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn as nn
from torch import Tensor

from winpos.cache import GridCache
from winpos.errors import WinposError, as_hw, check_choice
from winpos.posemb.coords import query_key_coords

__all__ = ["AXIS_ORDERS", "COORDS", "KINDS", "PAIRINGS", "RoPE", "RopeTables", "apply_rope", "axial_frequencies",
           "init_mixed_frequencies", "query_key_coords", "rope_on_grid", "rope_rot_dims", "rotate_grid",
           "spread_table"]

KINDS = ("axial", "mixed")
PAIRINGS = ("half", "interleaved")
AXIS_ORDERS = ("yx", "xy")
COORDS = ("integer", "normalized", "centered")


class RopeTables(NamedTuple):
    """cos/sin of the rotation angles for one (query grid, key grid) pair.

    cos_q, sin_q: ``(Nq, R/2)`` (shared by heads) or ``(heads, Nq, R/2)``; cos_k, sin_k likewise with Nk.
    rot_dims: R, the number of leading head dims that are rotated. pairing: ``"interleaved"`` or ``"half"``.
    """

    cos_q: Tensor
    sin_q: Tensor
    cos_k: Tensor
    sin_k: Tensor
    rot_dims: int
    pairing: str


def rope_rot_dims(head_dim: int, fraction: float) -> int:
    """R: the largest multiple of 4 that is <= ``fraction * head_dim`` (2 axes x whole dim pairs)."""
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise WinposError(
            f"head_dim={head_dim!r} must be a positive even int (RoPE rotates dims in pairs); "
            "choose embed_dim and num_heads so that embed_dim // num_heads is even"
        )
    if not (isinstance(fraction, (int, float)) and 0.0 < fraction <= 1.0):
        raise WinposError(f"rope fraction={fraction!r} must be in (0, 1]; it is the share of head dims rotated")
    # The epsilon keeps e.g. 0.3 * 40 = 11.999999... from dropping a whole group of 4 dims.
    rot = int(math.floor(fraction * head_dim + 1e-9)) // 4 * 4
    if rot == 0:
        raise WinposError(
            f"fraction={fraction} of head_dim={head_dim} rotates fewer than 4 dims (2 axes x 1 pair); "
            f"raise fraction to at least {4 / head_dim:.3g} or use a larger head_dim"
        )
    return rot


def axial_frequencies(rot_dims: int, base: float, device=None) -> Tensor:
    """``(R/4,)`` float32 ladder ``base^(-i/n)``, n = R/4, computed in the same float32 steps as timm's bands."""
    n = rot_dims // 4
    exponent = torch.arange(n, device=device, dtype=torch.int64).to(torch.float32) / n
    return 1.0 / torch.pow(float(base), exponent)


def init_mixed_frequencies(
    rot_dims: int, num_heads: int, base: float = 10.0, axis_order: str = "yx", rotate: bool = True, generator=None
) -> Tensor:
    """RoPE-Mixed initial frequencies ``(2, num_heads, R/2)`` = ``(f_y, f_x)`` per angle slot, float32.

    Magnitudes ``base^(-4k/R)`` for k < R/4 (rope-vit / timm ``init_random_2d_freqs``). Each head draws one angle
    ``a ~ U(0, 2pi)`` (``rotate=False``: a = 0); the first R/4 slots point along direction ``a`` and the next R/4
    along ``a + pi/2``. Direction 0 is the first axis of ``axis_order``, so with ``rotate=False`` the angles are
    exactly the axial ones (same ``axis_order``, base). ``axis_order="xy"`` with the global RNG reproduces
    timm's draw: ``torch.manual_seed(s); timm_freqs[(0, 1)] == ours[(1, 0)]`` (timm stores ``(f_x, f_y)``).
    """
    mag = 1.0 / torch.pow(float(base), torch.arange(0, rot_dims, 4, dtype=torch.float32) / rot_dims)
    if rotate:
        angle = torch.rand(num_heads, 1, generator=generator, dtype=torch.float32) * 2 * math.pi
    else:
        angle = torch.zeros(num_heads, 1, dtype=torch.float32)
    first = torch.cat([mag * torch.cos(angle), mag * torch.cos(angle + math.pi / 2)], dim=-1)  # along axis_order[0]
    second = torch.cat([mag * torch.sin(angle), mag * torch.sin(angle + math.pi / 2)], dim=-1)
    f_y, f_x = (first, second) if axis_order == "yx" else (second, first)
    return torch.stack([f_y, f_x])


def _check_apply_inputs(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str) -> None:
    check_choice("pairing", pairing, PAIRINGS)
    if x.dim() != 4 or not x.is_floating_point():
        raise WinposError(
            f"apply_rope expects a float x of shape (B, heads, N, head_dim), got {x.dtype} {tuple(x.shape)}; "
            "reshape tokens to (B, heads, N, head_dim) before rotating"
        )
    _, heads, n, head_dim = x.shape
    if not isinstance(rot_dims, int) or rot_dims <= 0 or rot_dims % 2 or rot_dims > head_dim:
        raise WinposError(
            f"rot_dims={rot_dims!r} must be a positive even int <= head_dim={head_dim}; "
            "build the tables with RoPE(head_dim=...) for this attention's head_dim"
        )
    if cos.shape != sin.shape or cos.dim() not in (2, 3):
        raise WinposError(
            f"cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must share a shape (N, R/2) or (heads, N, R/2); "
            "pass the matching pair from one RopeTables"
        )
    if cos.shape[-1] != rot_dims // 2 or cos.shape[-2] != n or (cos.dim() == 3 and cos.shape[0] not in (1, heads)):
        raise WinposError(
            f"rope tables {tuple(cos.shape)} do not fit x {tuple(x.shape)} with rot_dims={rot_dims}: expected "
            f"(N={n}, {rot_dims // 2}) or (heads={heads}, N={n}, {rot_dims // 2}); request the tables for this "
            "grid (q tables for q, k tables for k)"
        )


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str) -> Tensor:
    """Rotate the first ``rot_dims`` head dims of x by the angles whose cos/sin are given.

    Args:
        x: ``(B, heads, N, head_dim)``, any float dtype.
        cos, sin: ``(N, R/2)`` or ``(heads, N, R/2)`` (float32; float64 is kept as float64).
        rot_dims: R (even, <= head_dim). pairing: ``"interleaved"`` (pairs (2j, 2j+1)) or ``"half"`` (j, j+R/2).
    Returns:
        ``(B, heads, N, head_dim)`` in x's dtype; dims >= R are x's own values. The rotation runs in at least
        float32, so low-precision inputs are rounded once, at the end. Differentiable in x, cos and sin.
    """
    _check_apply_inputs(x, cos, sin, rot_dims, pairing)
    compute = torch.promote_types(torch.promote_types(x.dtype, cos.dtype), torch.float32)
    half = rot_dims // 2
    xr = x[..., :rot_dims].to(compute)
    c, s = cos.to(compute), sin.to(compute)
    if pairing == "interleaved":
        a, b = xr[..., 0::2], xr[..., 1::2]
    else:
        a, b = xr[..., :half], xr[..., half:]
    ra, rb = a * c - b * s, b * c + a * s
    if pairing == "interleaved":
        rotated = torch.stack([ra, rb], dim=-1).flatten(-2)
    else:
        rotated = torch.cat([ra, rb], dim=-1)
    rotated = rotated.to(x.dtype)
    if rot_dims == x.shape[-1]:
        return rotated
    return torch.cat([rotated, x[..., rot_dims:]], dim=-1)


# ------------------------------------------------------------------------------------------ RoPE on the grid
# The one PyTorch rotation of q and k in the ``(B, H, W, heads, D)`` grid layout (the attention reference uses it;
# the Triton kernels rotate the same way on load).
def spread_table(table: Tensor, win_hw, grid_hw) -> Tensor:
    """Spread a per-window table ``(N, R/2)`` or ``(heads, N, R/2)`` over a grid whose windows it tiles (the whole
    grid for global attention): ``(H, W, 1 | heads, R/2)``, token (y, x) taking the row of ``(y % wh, x % ww)``.
    Differentiable (a gather)."""
    (wh, ww), (H, W) = win_hw, grid_hw
    ys = torch.arange(H, device=table.device) % wh
    xs = torch.arange(W, device=table.device) % ww
    idx = ys[:, None] * ww + xs[None, :]
    return table[idx][:, :, None] if table.dim() == 2 else table[:, idx].permute(1, 2, 0, 3)


def rotate_grid(x: Tensor, cos: Tensor, sin: Tensor, rot_dims: int, pairing: str) -> Tensor:
    """RoPE on grid tensors ``(B, H, W, heads, D)`` with spread ``(H, W, 1 | heads, R/2)`` tables (``spread_table``);
    only the first R dims are touched, in at least fp32, written into one fresh tensor (cheaper than rotating
    partitioned copies). Same arithmetic as ``apply_rope``."""
    half = rot_dims // 2
    compute = torch.promote_types(x.dtype, torch.float32)
    if pairing == "half":
        pick = (slice(0, half), slice(half, rot_dims))
    else:
        pick = (slice(0, rot_dims, 2), slice(1, rot_dims, 2))
    a, b = x[..., pick[0]].to(compute), x[..., pick[1]].to(compute)
    c, s = cos.to(compute), sin.to(compute)
    if compute == x.dtype and not torch.compiler.is_compiling() and not torch.jit.is_tracing() and not (
            torch.is_grad_enabled() and (x.requires_grad or c.requires_grad or s.requires_grad)):
        # Inference in fp32: write each rotated half in place (a multiply and a fused multiply-add), no temporaries.
        # (Not while compiling: strided out= breaks the graph, and the compiler fuses the expression below anyway;
        # not while tracing: torch.onnx.export loses writes into views of out, so the rotation never reached out.)
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if rot_dims < x.shape[-1]:
            out[..., rot_dims:] = x[..., rot_dims:]
        out_a, out_b = out[..., pick[0]], out[..., pick[1]]
        torch.mul(a, c, out=out_a).addcmul_(b, s, value=-1)
        torch.mul(b, c, out=out_b).addcmul_(a, s)
        return out
    out = x.clone(memory_format=torch.contiguous_format)
    out[..., pick[0]] = a * c - b * s
    out[..., pick[1]] = b * c + a * s
    return out


def rope_on_grid(q: Tensor, k: Tensor, rope, q_window, k_window) -> tuple[Tensor, Tensor]:
    """Rotate q ``(B, Hq, Wq, heads, D)`` and k ``(B, Hk, Wk, heads, D)`` on their grids with the provider's
    window-local tables (``q_window`` / ``k_window``: the attention group, the whole grid for global attention).

    ``rope``: a ``RoPE`` (its spread tables are cached per grid) or any object with ``tables(q_hw, k_hw) ->
    RopeTables`` (spread on every call)."""
    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    if isinstance(rope, RoPE):
        cos_q, sin_q, cos_k, sin_k = rope.grid_tables(q_window, k_window, q_hw, k_hw)
        rot_dims, pairing = rope.rot_dims, rope.pairing
    else:
        t = rope.tables(q_window, k_window)
        cos_q, sin_q = spread_table(t.cos_q, q_window, q_hw), spread_table(t.sin_q, q_window, q_hw)
        cos_k, sin_k = spread_table(t.cos_k, k_window, k_hw), spread_table(t.sin_k, k_window, k_hw)
        rot_dims, pairing = t.rot_dims, t.pairing
    return rotate_grid(q, cos_q, sin_q, rot_dims, pairing), rotate_grid(k, cos_k, sin_k, rot_dims, pairing)



class RoPE(nn.Module):
    """Tables of 2D rotary position embedding for one attention layer.

    Args:
        head_dim: per-head channels (even).
        num_heads: heads of the attention that consumes the tables.
        kind: ``"axial"`` (fixed frequency ladder) or ``"mixed"`` (learnable ``freqs``, RoPE-Mixed).
        fraction: share of head dims rotated, in (0, 1]; R = largest multiple of 4 <= fraction * head_dim.
        base: axial ladder base (rope-vit uses 100 on integer coordinates; timm/EVA 10000). Unused by mixed.
        shared_heads: one table for all heads. Per-head tables exist only for ``kind="mixed"`` (each head learns
            its own frequency vectors); axial with ``shared_heads=False`` is rejected since every head would get
            the same fixed ladder anyway.
        pairing: ``"half"`` (rotate_half; vector-friendly loads, default for new models) or ``"interleaved"``
            (timm, EVA, rope-vit checkpoints).
        axis_order: ``"yx"``: the first R/4 angle slots follow y, the next follow x; ``"xy"``: the reverse. For
            mixed it only orients the initialization (direction 0 = first axis).
        coords: where a token sits, per axis of the attention extent (the window in window blocks, the grid in global
            blocks), each family's own convention:

            - ``"integer"``: token indices ``t`` (RoPE-ViT: positions beyond the pretraining grid extrapolate);
            - ``"normalized"``: ``t * ref / size`` (EVA-02: any extent is rescaled into the pretraining grid
              ``ref_hw``);
            - ``"centered"``: ``2 (t + 0.5) / size - 1`` in [-1, 1] (DINOv3), with the axial ladder read as periods:
              angle ``2 pi c / base^(i/n)``. Axial only.
        ref_hw: reference (pretraining) grid for ``coords="normalized"``.
        mixed_init_base: magnitude base of the mixed initialization (10 in rope-vit).

    ``tables(q_hw, k_hw)`` returns :class:`RopeTables`. Axial tables are cached per (q_hw, k_hw, device);
    mixed tables are recomputed per call (freqs are learned) from cached coordinate grids.
    """

    def __init__(self, head_dim: int, num_heads: int, kind: str = "axial", fraction: float = 0.5,
                 base: float = 100.0, shared_heads: bool = True, pairing: str = "half", axis_order: str = "yx",
                 coords: str = "integer", ref_hw=None, mixed_init_base: float = 10.0):
        super().__init__()
        self.kind = check_choice("kind", kind, KINDS)
        self.pairing = check_choice("pairing", pairing, PAIRINGS)
        self.axis_order = check_choice("axis_order", axis_order, AXIS_ORDERS)
        self.coords = check_choice("coords", coords, COORDS)
        if not isinstance(num_heads, int) or num_heads <= 0:
            raise WinposError(f"num_heads={num_heads!r} must be a positive int")
        self.rot_dims = rope_rot_dims(head_dim, fraction)
        self.head_dim, self.num_heads, self.fraction = head_dim, num_heads, fraction
        for name, value in (("base", base), ("mixed_init_base", mixed_init_base)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise WinposError(f"{name}={value!r} must be a finite positive number (e.g. 100 axial, 10 mixed)")
        self.base, self.mixed_init_base = float(base), float(mixed_init_base)
        if coords == "normalized":
            if ref_hw is None:
                raise WinposError(
                    "coords='normalized' rescales positions onto a reference grid; pass ref_hw=(H, W) of the "
                    "pretraining grid, or use coords='integer'"
                )
            self.ref_hw = as_hw(ref_hw, "ref_hw")
        elif ref_hw is not None:
            raise WinposError(f"ref_hw={ref_hw!r} is only used with coords='normalized'; drop it or switch coords")
        else:
            self.ref_hw = None
        if coords == "centered" and kind != "axial":
            raise WinposError("coords='centered' is DINOv3's axial convention (periods over [-1, 1]); use "
                              "kind='axial', or coords='integer' for mixed frequencies")
        self.shared_heads = bool(shared_heads)
        if kind == "axial":
            if not self.shared_heads:
                raise WinposError(
                    "kind='axial' has one fixed frequency ladder for all heads, so shared_heads=False would "
                    "only copy it; use shared_heads=True, or kind='mixed' for learnable per-head frequencies"
                )
            self.register_buffer("inv_freq", self._ladder(), persistent=False)
        else:
            heads = 1 if self.shared_heads else num_heads
            self.freqs = nn.Parameter(
                init_mixed_frequencies(self.rot_dims, heads, self.mixed_init_base, self.axis_order)
            )
        # Per grid (winpos.cache): coordinates, axial tables, and tables spread over a whole grid.
        self._coords, self._tables, self._grid_tables = GridCache(8), GridCache(8), GridCache(8)

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        # .half()/.bfloat16() would quantize the ladder, and position x frequency amplifies the error: keep fp32.
        if self.kind == "axial" and self.inv_freq.dtype != torch.float32:
            self.inv_freq = self._ladder(device=self.inv_freq.device)
        return module

    def _ladder(self, device=None) -> Tensor:
        """The axial frequencies: ``base^(-i/n)``, times ``2 pi`` for centered coordinates (DINOv3's periods)."""
        w = axial_frequencies(self.rot_dims, self.base, device=device)
        return w * (2 * math.pi) if self.coords == "centered" else w

    def no_weight_decay(self) -> set[str]:
        """Parameter names to exclude from weight decay (rope-vit / timm convention)."""
        return {"freqs"} if self.kind == "mixed" else set()

    def _grids(self, q_hw, k_hw, device) -> tuple[Tensor, Tensor]:
        def build():
            # Built outside inference mode so a cache filled during eval stays usable in training.
            with torch.inference_mode(False), torch.no_grad():
                grid_q, grid_k = query_key_coords(q_hw, k_hw, self.ref_hw, device)
                if self.coords == "centered":
                    size = torch.tensor(as_hw(k_hw, "k_hw"), dtype=torch.float32, device=device)
                    grid_q, grid_k = ((g + 0.5) / size * 2 - 1 for g in (grid_q, grid_k))
                return grid_q, grid_k

        return self._coords.get((q_hw, k_hw, device), build)

    def _source(self) -> Tensor:
        """The tensor the tables are computed from: the fixed ladder (axial) or the learned frequencies (mixed)."""
        return self.inv_freq if self.kind == "axial" else self.freqs

    def _axial_angles(self, grid: Tensor) -> Tensor:
        first, second = (0, 1) if self.axis_order == "yx" else (1, 0)
        w = self.inv_freq
        return torch.cat([grid[:, first, None] * w, grid[:, second, None] * w], dim=-1)  # (N, R/2)

    def _mixed_angles(self, grid: Tensor) -> Tensor:
        f = self.freqs.to(torch.promote_types(self.freqs.dtype, torch.float32))
        y, x = grid[None, :, 0, None].to(f.dtype), grid[None, :, 1, None].to(f.dtype)
        angles = y * f[0][:, None, :] + x * f[1][:, None, :]  # (heads or 1, N, R/2)
        return angles[0] if self.shared_heads else angles

    def tables(self, q_hw, k_hw) -> RopeTables:
        """cos/sin tables for queries on a ``q_hw`` grid attending to keys on a ``k_hw`` grid.

        ``q_hw == k_hw``: same coordinates (and the same tensors). ``q_hw`` smaller: pooled queries at key-cell
        centres; the stride ``k / q`` must be an integer per axis. Returns :class:`RopeTables` (see module doc).
        """
        q_hw, k_hw = as_hw(q_hw, "q_hw"), as_hw(k_hw, "k_hw")
        device = self._source().device
        if self.kind == "axial":
            def build():
                grid_q, grid_k = self._grids(q_hw, k_hw, device)
                with torch.inference_mode(False), torch.no_grad():
                    ang_k = self._axial_angles(grid_k)
                    ang_q = ang_k if q_hw == k_hw else self._axial_angles(grid_q)
                    cos_k, sin_k = ang_k.cos(), ang_k.sin()
                    cos_q, sin_q = (cos_k, sin_k) if q_hw == k_hw else (ang_q.cos(), ang_q.sin())
                return RopeTables(cos_q, sin_q, cos_k, sin_k, self.rot_dims, self.pairing)

            return self._tables.get((q_hw, k_hw), build, self.inv_freq)
        grid_q, grid_k = self._grids(q_hw, k_hw, device)
        ang_k = self._mixed_angles(grid_k)
        cos_k, sin_k = ang_k.cos(), ang_k.sin()
        if q_hw == k_hw:
            cos_q, sin_q = cos_k, sin_k
        else:
            ang_q = self._mixed_angles(grid_q)
            cos_q, sin_q = ang_q.cos(), ang_q.sin()
        return RopeTables(cos_q, sin_q, cos_k, sin_k, self.rot_dims, self.pairing)

    def grid_tables(self, q_window, k_window, q_hw, k_hw) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``tables(q_window, k_window)`` spread over a ``q_hw`` query and a ``k_hw`` key grid that the windows
        tile: ``(cos_q, sin_q, cos_k, sin_k)``, each ``(H, W, 1 | heads, R/2)`` (see ``spread_table``). Cached per
        grid; recomputed (differentiably) while the mixed frequencies are being trained."""
        def build():
            t = self.tables(q_window, k_window)
            return (spread_table(t.cos_q, q_window, q_hw), spread_table(t.sin_q, q_window, q_hw),
                    spread_table(t.cos_k, k_window, k_hw), spread_table(t.sin_k, k_window, k_hw))

        key = (tuple(q_window), tuple(k_window), tuple(q_hw), tuple(k_hw))
        return self._grid_tables.get(key, build, self._source())

    def grid_positions(self, hw) -> Tensor:
        """Positions ``(N, 2)`` (y, x), float32, of the tokens of an ``hw`` grid (row-major) in the units the
        angles take: the coordinates ``tables(hw, hw)`` rotates by (diagnostics read them)."""
        hw = as_hw(hw, "hw")
        return self._grids(hw, hw, self._source().device)[1]

    def grid_angles(self, hw) -> Tensor:
        """Rotation angles in radians of the tokens of an ``hw`` grid, exactly those whose cos/sin
        ``tables(hw, hw)`` holds: ``(N, R/2)`` shared by heads, or ``(heads, N, R/2)`` per head. No gradient."""
        grid = self.grid_positions(hw)
        with torch.no_grad():
            return self._axial_angles(grid) if self.kind == "axial" else self._mixed_angles(grid)

    def extra_repr(self) -> str:
        ref = f", ref_hw={self.ref_hw}" if self.ref_hw is not None else ""
        heads = "shared" if self.shared_heads else f"per-head({self.num_heads})"
        return (f"kind={self.kind}, rot_dims={self.rot_dims}/{self.head_dim}, base={self.base:g}, heads={heads}, "
                f"pairing={self.pairing}, axis_order={self.axis_order}, coords={self.coords}{ref}")

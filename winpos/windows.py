"""The one padding and windowing helper shared by the reference path, the backbones and the kernels' tests.

Padding policy (detectron2, SAM v1, SAM2): a grid that windows cannot tile is zero-padded at the bottom and right
*after* ``norm1`` and before the qkv projection, so padded tokens carry q = b_q, k = b_k, v = b_v and act as real,
unmasked keys for the valid queries of edge windows; their outputs are cropped away. ``pad_mode="mask"`` instead
hides padded keys from valid queries (not bit-compatible with those checkpoints, but resolution-consistent).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from winpos.errors import WinposError

__all__ = ["PAD_MODES", "attention_groups", "ceil_div", "pad_to_window", "padded_size", "valid_key_mask", "window_partition", "window_unpartition"]

PAD_MODES = ("zeros", "mask")


def attention_groups(q_hw, k_hw, window):
    """How a ``q_hw`` query grid attends to a ``k_hw`` key grid in ``window`` windows (None/0: one global group).

    Returns ``(n_wh, n_ww, q_window, k_window, pool)``: windows per column and row, the query and key window
    ``(h, w)`` in tokens (the whole grids for global attention) and the query pooling stride (Hiera q-pool). The
    one rule set of the reference path and the Triton kernels: the query grid is the key grid pooled by one
    integer stride, the stride divides the window and the window tiles the (padded) key grid.
    """
    (Hq, Wq), (Hk, Wk) = q_hw, k_hw
    if Hk % Hq or Wk % Wq or Hk // Hq != Wk // Wq:
        raise WinposError(f"query grid {Hq}x{Wq} must be the key grid {Hk}x{Wk} pooled by one integer stride "
                          "(Hiera q-pooling)")
    pool = Hk // Hq
    if window is None or window == 0:
        return 1, 1, (Hq, Wq), (Hk, Wk), pool
    if not isinstance(window, int) or window < 0:
        raise WinposError(f"window={window!r} must be a positive int, or None/0 for global attention")
    if window % pool:
        raise WinposError(f"window {window} is not divisible by the query pooling stride {pool}")
    if Hk % window or Wk % window:
        raise WinposError(f"window_size={window} does not tile the {Hk}x{Wk} token grid; pad the grid with "
                          "winpos.windows.pad_to_window first (the backbones do) or choose a window that divides it")
    qw = window // pool
    return Hk // window, Wk // window, (qw, qw), (window, window), pool


def ceil_div(size: int, step: int) -> int:
    """``ceil(size / step)`` for a size >= 0 and a step > 0, written with non-negative operands only.

    Under ``torch.jit.trace`` (``torch.onnx.export``) a grid size is a traced integer, and the ONNX export of ``//``
    on a negative one truncates instead of flooring: ``-(-4 // 14)`` gave 0, a negative pad, a grid of 0 windows and
    onnxruntime's 'Integer division by zero'. Every ceil of a grid size on a model's forward path goes through here.
    """
    return (size + step - 1) // step


def padded_size(size: int, window: int) -> int:
    """``size`` rounded up to a multiple of ``window``."""
    return ceil_div(size, window) * window


def pad_to_window(x: torch.Tensor, window) -> tuple[torch.Tensor, tuple[int, int]]:
    """Zero-pad ``(B, H, W, C)`` at the bottom/right to multiples of ``window``; returns ``(x_pad, (H, W))``."""
    B, H, W, C = x.shape
    wh, ww = (window, window) if isinstance(window, int) else window
    pad_h, pad_w = padded_size(H, wh) - H, padded_size(W, ww) - W
    if pad_h or pad_w:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    return x, (H, W)


def window_partition(x: torch.Tensor, window: int) -> torch.Tensor:
    """``(B, Hp, Wp, *rest) -> (B * nW, window * window, *rest)`` for a grid that windows tile exactly."""
    B, Hp, Wp = x.shape[:3]
    rest = x.shape[3:]
    if Hp % window or Wp % window:
        raise WinposError(f"window {window} does not tile the {Hp}x{Wp} grid; pad it first with pad_to_window")
    x = x.reshape(B, Hp // window, window, Wp // window, window, *rest)
    x = x.transpose(2, 3)
    return x.reshape(B * (Hp // window) * (Wp // window), window * window, *rest)


def window_unpartition(windows: torch.Tensor, window: int, grid_hw: tuple[int, int]) -> torch.Tensor:
    """Inverse of ``window_partition``: ``(B * nW, window * window, *rest) -> (B, Hp, Wp, *rest)``."""
    Hp, Wp = grid_hw
    nh, nw = Hp // window, Wp // window
    rest = windows.shape[2:]
    B = windows.shape[0] // (nh * nw)
    x = windows.reshape(B, nh, nw, window, window, *rest).transpose(2, 3)
    return x.reshape(B, Hp, Wp, *rest)


def valid_key_mask(grid_hw, valid_hw, window: int, device) -> torch.Tensor:
    """Boolean ``(nW, window*window)``: True where the token of each window lies inside the unpadded grid."""
    Hp, Wp = grid_hw
    H, W = valid_hw
    inside = (torch.arange(Hp, device=device)[:, None] < H) & (torch.arange(Wp, device=device)[None, :] < W)
    return window_partition(inside[None, :, :, None], window)[..., 0]

"""Triton kernels for fused window attention (installed as ``winpos.kernels``).

``window_attention(q, k, v, *, window, pos, valid_hw=None, pad_mode="zeros", scale=None)`` is the fused twin of
``winpos.attention.reference_attention``; ``rope_grid`` is the standalone RoPE kernel (baseline). Importing this
package is cheap and works without a GPU: it registers the ``winpos::`` custom ops and imports triton only when a
kernel is first launched. On CPU the kernels run only under the Triton interpreter (``TRITON_INTERPRET=1`` set
before triton is first imported; see ``_jit``).

Without the ``triton`` package installed, ``window_attention`` is not exported (``from winpos.kernels import
window_attention`` raises ImportError), so ``winpos.attention`` falls back to its reference backend.

Modules:

    attention_fwd_bwd   host side of fused window attention: launch plans, ``torch.library`` ops, autograd Function
    dispatch            ``window_attention``, the fused twin of the reference attention, and when to prefer it
    launch_config       tile sizes, windows per program, warps and stages of the attention kernels
    rope                the standalone RoPE kernel on the token grid (the unfused baseline) and its autograd
    self_check          each launch signature checked against the reference before it first serves
    _jit                lazy, mode-consistent import of the Triton sources (interpreter or compiled)
    tl_attention        Triton kernels of window attention: forward, dQ pass, dK/dV pass
    tl_common           Triton device helpers shared by the attention and RoPE kernels
    tl_relpos           Triton helpers of the decomposed relative-position bias
    tl_rope             Triton source of the standalone RoPE kernel
    tl_tiles            Triton helpers: which tokens a tile holds, where they sit, the padding mask
"""
import importlib.util

from .attention_fwd_bwd import Plan, WindowAttentionFunction, attention_flops
from .launch_config import default_blocks
from .rope import RopeGridFunction, rope_grid, rotate_on_grid
from .self_check import KernelSelfCheckWarning, self_check_report, set_self_check

TRITON_INSTALLED = importlib.util.find_spec("triton") is not None

if TRITON_INSTALLED:
    from .dispatch import prefers_kernels, window_attention
else:
    def __getattr__(name):
        if name in ("window_attention", "prefers_kernels"):
            raise ImportError("winpos.kernels.window_attention needs the `triton` package (pip install triton); "
                              "use winpos.attention with backend='reference' meanwhile")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["KernelSelfCheckWarning", "Plan", "RopeGridFunction", "TRITON_INSTALLED", "WindowAttentionFunction",
           "attention_flops", "default_blocks", "prefers_kernels", "rope_grid", "rotate_on_grid", "self_check_report",
           "set_self_check", "window_attention"]

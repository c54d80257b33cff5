"""The one attention entry point of winpos: window or global attention on a token grid, with position terms.

Callers pass q, k, v on the (padded) token grid and a *description* of the position terms (a RoPE provider,
relpos tables, a LookHere provider), never a materialized N x N bias. Two backends give the same answer:

- ``reference``: PyTorch SDPA on partitioned windows (``winpos.attention.reference``).
- ``triton``: the fused kernels of ``winpos.kernels`` (CUDA only), which compute every term per tile.
- ``flex``: PyTorch's FlexAttention with relpos / LookHere as a ``score_mod`` and LookHere's fields of view and
  the padding mask as a block mask (``winpos.attention.flex``); compiled once per shape. Inference only on CPU
  (PyTorch has no CPU backward for it).

``backend="auto"`` picks Triton on CUDA when it is installed and the reference elsewhere (never flex: on CPU the
reference is faster, 0.36 s vs 1.47 s for one ViTDet-B global relpos block at 1024^2, and on CUDA the Triton
kernels compute the same terms per tile); ``WINPOS_ATTENTION_BACKEND=reference|triton|flex`` forces one globally.

The package by job: ``terms`` (the input types and their validation), ``geometry`` (groups and the padding mask,
with the kernels' rules), ``reference`` (the SDPA backend), ``bias`` (building its additive bias), ``workspace``
(its reused CPU mask buffer), ``flex`` (the FlexAttention backend) and ``spec`` (the materialized specification
the tests compare against).

Modules:

    terms           the op's inputs (q, k, v, position-term descriptions) and their validation
    geometry        attention groups (windows or one global group) and the padding mask, with the kernels' rules
    reference       the reference backend: PyTorch SDPA on partitioned windows
    bias            the reference path's additive bias: LookHere, padding mask, relpos rows
    workspace       the reference path's reused CPU mask buffer, one per thread and dtype
    relpos_train    decomposed relpos attention for training on the reference backend, queries in blocks
    flex            the FlexAttention backend (relpos / LookHere as a ``score_mod``, a block mask)
    spec            the materialized specification the tests compare every backend against
"""
from __future__ import annotations

import os

import torch

from winpos.attention.reference import reference_attention
from winpos.attention.spec import dense_attention
from winpos.attention.terms import PositionTerms, check_inputs
from winpos.attention.workspace import release_workspace
from winpos.errors import WinposError, check_choice
from winpos.windows import PAD_MODES

__all__ = ["BACKENDS", "PositionTerms", "attention", "dense_attention", "reference_attention", "release_workspace",
           "resolve_backend"]

BACKENDS = ("auto", "reference", "triton", "flex")


def resolve_backend(backend: str, device: torch.device, qkv=None) -> str:
    """``"reference"``, ``"triton"`` or ``"flex"`` for ``backend``; the one place the backend is decided.

    ``"auto"``: Triton on CUDA when installed, the reference elsewhere; the ``WINPOS_ATTENTION_BACKEND`` environment
    variable overrides ``"auto"``. With ``qkv`` (the projected q, k, v) given, ``"auto"`` on CUDA also sends inputs
    the kernels do not take fast (fp32, fp64, head dims outside 16..128; ``winpos.kernels.prefers_kernels``) to the
    reference instead of a slow path or an error. A forced ``"triton"`` or ``"flex"`` is never overridden.
    """
    from winpos.kernels import TRITON_INSTALLED

    auto = backend == "auto"
    backend = os.environ.get("WINPOS_ATTENTION_BACKEND", backend) if auto else backend
    check_choice("attention backend", backend, BACKENDS)
    if backend == "auto":
        if device.type != "cuda" or not TRITON_INSTALLED:
            return "reference"
        if qkv is not None:
            from winpos.kernels import prefers_kernels

            return "triton" if prefers_kernels(*qkv) else "reference"
        return "triton"
    if backend == "triton" and not TRITON_INSTALLED:
        raise WinposError("backend='triton' was forced but winpos.kernels could not be imported; install triton")
    if backend == "flex":
        from winpos.attention.flex import flex_available

        if not flex_available():
            raise WinposError(f"backend='flex' was forced but torch {torch.__version__} has no "
                              "torch.nn.attention.flex_attention; upgrade torch (>= 2.5) or use backend='reference'")
    return backend


def attention(q, k, v, *, window=None, pos: PositionTerms | None = None, valid_hw=None, pad_mode="zeros",
              scale=None, backend="auto"):
    """Window or global attention on a token grid.

    Args:
        q: ``(B, Hq, Wq, heads, head_dim)`` queries; ``Hq = Hk / s`` for pooled queries (Hiera q-pool, stride s).
        k, v: ``(B, Hk, Wk, heads, head_dim)`` keys and values; the grid must already be padded to multiples of
            ``window`` (``winpos.windows.pad_to_window``).
        window: key window size, or None/0 for global attention. The query window is ``window / s``.
        pos: position terms (RoPE provider, relpos tables, LookHere provider).
        valid_hw: the unpadded key grid ``(H, W)``; used by ``pad_mode="mask"``.
        pad_mode: ``"zeros"`` (detectron2/SAM: padded tokens are unmasked keys) or ``"mask"``.
        scale: logit scale, default ``head_dim ** -0.5``.
        backend: ``"auto"``, ``"reference"``, ``"triton"`` or ``"flex"`` (see ``resolve_backend``).
    Returns:
        ``(B, Hq, Wq, heads, head_dim)``.
    """
    check_inputs(q, k, v)
    check_choice("pad_mode", pad_mode, PAD_MODES)
    chosen = resolve_backend(backend, q.device, (q, k, v))
    if chosen == "triton":
        from winpos.kernels import self_check, window_attention as triton_attention

        self_check.set_reference(reference_attention)  # what the kernels' first-use self-check compares with
        return triton_attention(q, k, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode, scale=scale)
    if chosen == "flex":
        from winpos.attention.flex import flex_attention

        return flex_attention(q, k, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode, scale=scale)
    return reference_attention(q, k, v, window=window, pos=pos, valid_hw=valid_hw, pad_mode=pad_mode, scale=scale)

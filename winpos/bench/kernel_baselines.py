"""The implementations the fused kernels are timed against in ``winpos.bench.kernels``, and the kernels' own
entries, each as ``fn(qkv) -> out`` over one ``(B, H, W, 3, heads, D)`` projection output (``impl_fn``): SDPA on
partition copies of q, k and v (``sdpa_baseline``) or of the whole projection output (``sdpa_xpart``), with RoPE
applied by PyTorch and relpos / LookHere as a materialized bias (``sdpa_groups``); RoPE by the standalone kernel
before the fused one (``unfused_rope``); FlexAttention and the PyTorch reference through ``winpos.attention``.
``shape`` is a ``winpos.bench.kernel_common.Shape`` (window, pool, grid, heads, head_dim).
"""

def make_pos(shape, variant: str, device):
    """The position terms of a benchmark ``variant`` for a block ``shape`` (RoPE: axial, half of the head dims)."""
    from winpos.attention import PositionTerms
    from winpos.posemb.lookhere import LookHere
    from winpos.posemb.relpos import RelPosTables
    from winpos.posemb.rope import RoPE

    extent = shape.window or shape.grid[0]
    if variant == "rope":  # axial, half pairing, half of the head dims rotated
        return PositionTerms(rope=RoPE(shape.head_dim, shape.heads, fraction=0.5).to(device))
    if variant == "relpos":
        return PositionTerms(rel_pos=RelPosTables(shape.head_dim, extent, zero_init=False).to(device).tables())
    if variant == "lookhere":
        return PositionTerms(lookhere=LookHere(shape.heads, "45").to(device))
    return PositionTerms()


def sdpa_groups(qg, kg, vg, q_win, k_win, pos, backends):
    """SDPA over attention groups ``(groups, heads, N, D)`` with the position terms applied the unfused way: RoPE
    by PyTorch on q and k, relpos and LookHere as a materialized ``(groups, heads, Nq, Nk)`` bias."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    from winpos.posemb.relpos import rel_bias_dense
    from winpos.posemb.rope import apply_rope

    if pos.rope is not None:
        t = pos.rope.tables(q_win, k_win)
        qg = apply_rope(qg, t.cos_q, t.sin_q, t.rot_dims, t.pairing)
        kg = apply_rope(kg, t.cos_k, t.sin_k, t.rot_dims, t.pairing)
    bias = None
    if pos.rel_pos is not None:
        bias = rel_bias_dense(qg, *pos.rel_pos, q_win, k_win)
    if pos.lookhere is not None:
        bias = pos.lookhere.bias(q_win, k_win).to(qg.dtype).expand(qg.shape[0], -1, -1, -1)
    with sdpa_kernel(backends):
        return F.scaled_dot_product_attention(qg, kg, vg, attn_mask=bias)


def sdpa_baseline(q, k, v, window, pos, backends):
    """Partition copies of q, k and v + SDPA (+ materialized bias) + unpartition."""
    from winpos.windows import window_partition, window_unpartition

    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    pool = k_hw[0] // q_hw[0]
    q_win, k_win = ((window // pool,) * 2, (window,) * 2) if window else (q_hw, k_hw)

    def groups(x, win):
        x = window_partition(x, win[0]) if window else x.flatten(1, 2)
        return x.transpose(1, 2)  # (groups, heads, N, D)

    out = sdpa_groups(groups(q, q_win), groups(k, k_win), groups(v, k_win), q_win, k_win, pos, backends)
    out = out.transpose(1, 2)
    return window_unpartition(out, q_win[0], q_hw) if window else out.reshape(q.shape)


def unfused_rope(q, k, v, window, pos):
    from winpos.kernels import rope_grid, window_attention

    q_hw, k_hw = tuple(q.shape[1:3]), tuple(k.shape[1:3])
    pool = k_hw[0] // q_hw[0]
    q_win, k_win = ((window // pool,) * 2, (window,) * 2) if window else (q_hw, k_hw)
    t = pos.rope.tables(q_win, k_win)
    q = rope_grid(q, t.cos_q, t.sin_q, t.rot_dims, t.pairing, q_win)
    k = rope_grid(k, t.cos_k, t.sin_k, t.rot_dims, t.pairing, k_win)
    return window_attention(q, k, v, window=window)


def split_qkv(qkv, pool: int):
    """q, k, v views of a ``(B, H, W, 3, heads, D)`` projection output (q strided when pooled: read in place)."""
    q = qkv[:, ::pool, ::pool, 0] if pool > 1 else qkv[:, :, :, 0]
    return q, qkv[:, :, :, 1], qkv[:, :, :, 2]


def sdpa_xpart(qkv, window, pool, pos, backends):
    """The model's partition-x-once path: one window-partition copy of the whole projection output, q / k / v as
    views of it (pooled queries: every ``pool``-th token inside each window), SDPA, one unpartition copy."""
    from winpos.windows import window_partition, window_unpartition

    B, H, W, _, n, D = qkv.shape
    if not window:
        return sdpa_baseline(*split_qkv(qkv, pool), window, pos, backends)
    parts = window_partition(qkv.flatten(3), window).reshape(-1, window, window, 3, n, D)
    qw = window // pool
    qg = parts[:, ::pool, ::pool, 0].reshape(-1, qw * qw, n, D).transpose(1, 2)
    kg = parts[:, :, :, 1].reshape(-1, window * window, n, D).transpose(1, 2)
    vg = parts[:, :, :, 2].reshape(-1, window * window, n, D).transpose(1, 2)
    out = sdpa_groups(qg, kg, vg, (qw, qw), (window, window), pos, backends)
    return window_unpartition(out.transpose(1, 2), qw, (H // pool, W // pool))


IMPLS = ("sdpa", "sdpa_xpart", "sdpa_cudnn", "flex", "triton", "triton_rope_unfused", "reference")


def unavailable(impl: str, variant: str, cuda: bool):
    """Why ``impl`` cannot run for ``variant`` here (None when it can)."""
    if impl == "triton_rope_unfused" and variant != "rope":
        return "only for rope"
    if impl == "sdpa_cudnn":
        if not cuda:
            return "cuDNN attention needs CUDA"
        if variant in ("relpos", "lookhere"):
            return "cuDNN attention is timed without a bias only"
    if impl == "flex":
        from winpos.attention import BACKENDS

        if "flex" not in BACKENDS:
            return "this winpos has no FlexAttention backend"
        if not cuda:
            return "FlexAttention has no CPU backward (the rows time forward+backward)"
    return None


def impl_fn(impl: str, shape, pos, cuda: bool):
    """``fn(qkv) -> out`` of one implementation."""
    from torch.nn.attention import SDPBackend

    from winpos.attention import attention, reference_attention
    from winpos.kernels import window_attention

    s = shape.pool
    bias_variant = pos.rel_pos is not None or pos.lookhere is not None
    flash = [SDPBackend.FLASH_ATTENTION] if cuda else [SDPBackend.MATH]
    efficient = [SDPBackend.EFFICIENT_ATTENTION] if cuda else [SDPBackend.MATH]
    sdpa_backends = efficient if bias_variant else flash
    fns = {
        "triton": lambda x: window_attention(*split_qkv(x, s), window=shape.window, pos=pos),
        "triton_rope_unfused": lambda x: unfused_rope(*split_qkv(x, s), shape.window, pos),
        "sdpa": lambda x: sdpa_baseline(*split_qkv(x, s), shape.window, pos, sdpa_backends),
        "sdpa_xpart": lambda x: sdpa_xpart(x, shape.window, s, pos, sdpa_backends),
        "sdpa_cudnn": lambda x: sdpa_xpart(x, shape.window, s, pos, [SDPBackend.CUDNN_ATTENTION]),
        "flex": lambda x: attention(*split_qkv(x, s), window=shape.window, pos=pos, backend="flex"),
        "reference": lambda x: reference_attention(*split_qkv(x, s), window=shape.window, pos=pos),
    }
    return fns[impl]

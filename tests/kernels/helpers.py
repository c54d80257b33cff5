"""Shared pieces of the kernel tests: input builders and the kernel-vs-reference comparison.

Oracle: ``winpos.attention.reference_attention`` (itself tested against detectron2 / the dense specification in
``tests/test_attention.py``), run in float64 on the very values the kernel saw (fp16 inputs upcast exactly), so
the comparison measures the kernel's own error. Tolerances (atol = rtol): fp32 1e-4, fp16 2e-2, bf16 4e-2 (GPU).
"""
from dataclasses import dataclass
from typing import Any

import torch

from winpos.attention import PositionTerms, reference_attention
from winpos.kernels import _jit, window_attention
from winpos.posemb.lookhere import LookHere
from winpos.posemb.relpos import RelPosTables
from winpos.posemb.rope import RoPE, RopeTables

TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}
DEVICE = "cpu" if _jit.interpreting() else "cuda"


class FrozenRope:
    """A RoPE provider whose (possibly per-head, mixed) tables carry no gradient: the fused in-kernel path."""

    def __init__(self, rope: RoPE):
        self.rope = rope

    def tables(self, q_hw, k_hw) -> RopeTables:
        t = self.rope.tables(q_hw, k_hw)
        return RopeTables(t.cos_q.detach(), t.sin_q.detach(), t.cos_k.detach(), t.sin_k.detach(), t.rot_dims,
                          t.pairing)


@dataclass
class Case:
    """One kernel-vs-reference comparison. ``grid`` is the key grid; queries are pooled by ``pool``."""

    name: str
    grid: tuple
    heads: int
    head_dim: int
    window: Any = None
    pool: int = 1
    dtype: torch.dtype = torch.float32
    rope: dict = None  # RoPE(...) kwargs, plus "frozen": True for fixed per-head tables
    relpos: Any = None  # table extent (int or (h, w)), or None
    lookhere: str = None  # variant
    valid_hw: tuple = None  # with pad_mode="mask"
    blocks: tuple = (32, 32)
    pack: int = None  # windows per program (None: the kernels' default)
    layout: str = "qkv"  # "qkv": strided views of one packed tensor; "split": separate (v with other strides)
    batch: int = 1
    param_tol: float = None  # atol = rtol for the position-parameter gradients (default: the dtype's TOL)

    def __str__(self):
        return self.name


def make_qkv(case: Case, generator: torch.Generator):
    B, (H, W), n, D, s = case.batch, case.grid, case.heads, case.head_dim, case.pool

    def rnd(*shape):
        return torch.randn(*shape, generator=generator).to(device=DEVICE, dtype=case.dtype)

    if case.layout == "qkv" and s == 1:
        qkv = rnd(B, H, W, 3, n, D)
        q, k, v = (t.detach().requires_grad_() for t in qkv.unbind(3))  # strided views, read in place
    else:
        q = rnd(B, H // s, W // s, n, D).requires_grad_()
        k = rnd(B, H, W, n, D).requires_grad_()
        v = rnd(B, W, H, n, D).transpose(1, 2).detach().requires_grad_()  # other strides than k
    return q, k, v


def make_pos(case: Case):
    """PositionTerms for the case and the extra leaf parameters whose gradients are compared."""
    params = []
    rope = rel_pos = lookhere = None
    if case.rope is not None:
        kwargs = dict(case.rope)
        frozen = kwargs.pop("frozen", False)
        module = RoPE(case.head_dim, case.heads, **kwargs).to(DEVICE)
        if module.kind == "mixed" and not frozen:
            params.append(module.freqs)
        rope = FrozenRope(module) if frozen else module
    if case.relpos is not None:
        tables = RelPosTables(case.head_dim, case.relpos, zero_init=False, init_std=0.3).to(DEVICE)
        rel_pos = tables.tables()
        params += list(rel_pos)
    if case.lookhere is not None:
        lookhere = LookHere(case.heads, case.lookhere, layer_index=1, num_layers=4).to(DEVICE)
    return PositionTerms(rope=rope, rel_pos=rel_pos, lookhere=lookhere), params


def check_case(case: Case, seed: int = 0) -> dict:
    """Kernel output and every gradient (q, k, v, relpos tables, learnable RoPE freqs) vs the float64 reference.

    Returns the max abs errors (for reports). Raises AssertionError with the tensor name on a mismatch.
    """
    gen = torch.Generator().manual_seed(seed)
    q, k, v = make_qkv(case, gen)
    pos, params = make_pos(case)
    kwargs = dict(window=case.window, pos=pos, valid_hw=case.valid_hw,
                  pad_mode="mask" if case.valid_hw else "zeros")
    out = window_attention(q, k, v, blocks=case.blocks, pack=case.pack, **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    grad_out = torch.randn(out.shape, generator=gen).to(device=DEVICE, dtype=case.dtype)
    leaves = [q, k, v, *params]
    grads = torch.autograd.grad(out, leaves, grad_out)

    ref_leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref = reference_attention(*ref_leaves, **kwargs)
    ref_grads = torch.autograd.grad(ref, ref_leaves + params, grad_out.double())

    errors = {}
    names = ["out", "dq", "dk", "dv"] + [f"dparam{i}" for i in range(len(params))]
    for name, got, want in zip(names, [out, *grads], [ref, *ref_grads]):
        assert torch.isfinite(got).all(), f"{case}: {name} has non-finite values"
        errors[name] = (got.double() - want.double()).abs().max().item()
        tol = case.param_tol if name.startswith("dparam") and case.param_tol else TOL[case.dtype]
        torch.testing.assert_close(got.double(), want.double(), atol=tol, rtol=tol,
                                   msg=lambda m, name=name: f"{case}: {name}: {m}")
    return errors

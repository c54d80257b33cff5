"""What the kernel benchmark (``winpos.bench.kernels``) and its block-configuration sweep
(``winpos.bench.kernel_sweep``) share: the attention shapes, their inputs and launch plans, the timing of one
function, and the report they write. Both import this module; it imports neither.
"""
import json
import platform
from dataclasses import dataclass

from winpos.windows import padded_size

VARIANTS = ("none", "rope", "relpos", "lookhere")


@dataclass(frozen=True)
class Shape:
    """One attention block: key grid (already padded to the window), queries pooled by ``pool``."""

    model: str
    block: str
    batch: int
    grid: tuple
    heads: int
    head_dim: int
    window: int = None
    pool: int = 1


def gpu_shapes(batch: int = 2) -> list:
    """Attention shapes at a 1024x1024 input (patch 16 for ViTDet, patch 4 + 2x pooling per stage for HieraDet-B+,
    whose head_dim is 56 = 112 / 2), ViTDet-B, HieraDet-B+ s1..s4, ViTDet-L."""
    g = 64
    vitdet = {model: [Shape(model, "window14", batch, (padded_size(g, 14),) * 2, heads, 64, 14),
                      Shape(model, "global", batch, (g, g), heads, 64)] for model, heads in (("vitdet_b", 12),
                                                                                             ("vitdet_l", 16))}
    hiera = [
        Shape("hieradet_b+", "s1_window8", batch, (256, 256), 2, 56, 8),
        Shape("hieradet_b+", "s1to2_qpool_window8", batch, (256, 256), 4, 56, 8, pool=2),
        Shape("hieradet_b+", "s2_window4", batch, (128, 128), 4, 56, 4),  # four 4x4 windows per program
        Shape("hieradet_b+", "s3_window14", batch, (padded_size(g, 14),) * 2, 8, 56, 14),  # padded 64 -> 70
        Shape("hieradet_b+", "s3_global", batch, (g, g), 8, 56),
        Shape("hieradet_b+", "s4_window7", batch, (padded_size(32, 7),) * 2, 16, 56, 7),  # padded 32 -> 35
    ]
    shapes = vitdet["vitdet_b"] + hiera + vitdet["vitdet_l"]  # ViTDet-L last: the others matter first
    return shapes


def dry_run_shapes() -> list:
    return [Shape("tiny", "window4", 1, (8, 8), 2, 32, 4), Shape("tiny", "global_qpool", 1, (8, 8), 2, 32, pool=2)]


def timings(fn, cuda: bool, reps: int) -> dict:
    """Eager (L2 flushed) and CUDA-graph timings of ``fn``: ``{"ms", "range_ms", "graph_ms", "graph_error"}``."""
    from .cuda_timing import bench

    eager = bench(fn, reps=reps if cuda else 1, warmup=3 if cuda else 0)
    out = {"ms": eager["median_ms"], "range_ms": [eager["min_ms"], eager["max_ms"]], "graph_ms": None,
           "graph_error": None}
    if cuda:
        try:
            out["graph_ms"] = bench(fn, reps=reps, graph=True)["median_ms"]
        except Exception as e:  # not capturable: the eager timing stands, the reason is kept
            out["graph_error"] = f"{type(e).__name__}: {e}"[:300]
            import torch

            torch.cuda.synchronize()
    return out


def peak_mib(fn, cuda: bool):
    from .timing import cuda_peak_mib

    return cuda_peak_mib(fn) if cuda else None


def inputs(shape: Shape, dtype, device):
    import torch

    torch.manual_seed(0)
    B, (H, W), n, D = shape.batch, shape.grid, shape.heads, shape.head_dim
    return torch.randn(B, H, W, 3, n, D, device=device, dtype=dtype)


def plan(shape: Shape):
    from winpos.kernels import Plan

    H, W, s = *shape.grid, shape.pool
    q_hw = (H // s, W // s)
    qw = (shape.window // s,) * 2 if shape.window else q_hw
    kw = (shape.window,) * 2 if shape.window else (H, W)
    return Plan((H // kw[0]), (W // kw[1]), *qw, *kw, s, 0, 0, 0, 0, 0, 0, 0, 16, 16)


def time_fn(fn, qkv, cuda: bool, reps: int) -> dict:
    """Forward and forward+backward timings and peak memory of ``fn(qkv)``, and its forward output."""
    import torch

    leaf = qkv.detach().clone().requires_grad_()
    with torch.no_grad():
        out = fn(qkv)
    grad = torch.randn_like(out)

    def fwd():
        with torch.no_grad():
            fn(qkv)

    def fwd_bwd():
        o = fn(leaf)
        o.backward(grad)
        leaf.grad = None

    return {"out": out, "fwd": timings(fwd, cuda, reps), "fwd_bwd": timings(fwd_bwd, cuda, reps),
            "fwd_peak_mib": peak_mib(fwd, cuda), "fwd_bwd_peak_mib": peak_mib(fwd_bwd, cuda)}


def write(report: dict, out_path) -> None:
    if out_path:
        from winpos.utils.outputs import atomic_write

        atomic_write(out_path, lambda f: json.dump(report, f, indent=1), "w")


def new_report(device, dtype) -> dict:
    import torch

    import triton

    from winpos.kernels import _jit

    return dict(device=torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
                torch=torch.__version__, triton=triton.__version__, interpreter=_jit.interpreting(),
                dtype=str(dtype).replace("torch.", ""), rows=[], skipped=[], errors=[], unavailable=[])



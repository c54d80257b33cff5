"""Export a model to ONNX, a ``torch.export`` program (``.pt2``) and TorchScript, and check each in the runtime that
loads it (no detectron2 here; ``winpos.d2.export`` exports whole detectors with the same machinery).

What is exported is what eager runs, with two things fixed for the graph (``export_mode``): the attention takes
the reference path (PyTorch SDPA; no Triton kernel, no FlexAttention) and the fused oneDNN linear steps are off,
so no custom op lands in a graph. The per-grid position terms (abs-win tiles, RoPE tables, relpos resampling,
LookHere biases) are computed in the graph from the parameters for the grid of the example input, so:

- ONNX (``torch.onnx.export``, the TorchScript-based exporter, opset >= 17) and TorchScript (``torch.jit.trace``)
  graphs hold one input size each: one file per checked size, named ``<stem>_<H>x<W>``. onnxruntime refuses any
  other size itself; ``run_artifact`` refuses it for every format before running (a traced TorchScript module
  would run a LookHere or relpos graph at another size and return wrong numbers).
- ``.pt2``: exported with dynamic height and width first; where the program comes out specialized to the example
  grid (the position terms' shapes depend on it: every recipe with a position term), one program per size.

``export_and_check`` exports each format at each size, runs each artifact on a fresh input of its size, and
returns the max absolute error against the eager model; ``write_export`` writes the files only when every check
is within tolerance, all or nothing.
"""
from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from winpos.errors import WinposError, check_choice

__all__ = ["EXPORT_NOTE", "EXPORT_RECIPES", "FORMATS", "ONNX_MIN_OPSET", "TOLERANCE", "Artifact",
           "Check", "ExportResult", "Fp16Graph", "build_backbone", "fp16_tolerance", "check_onnx_setup", "export_and_check", "export_mode", "onnx_bytes", "planned_names", "require_onnxruntime",
           "run_artifact", "write_export"]

FORMATS = ("onnx", "pt2", "torchscript")
SUFFIX = {"onnx": ".onnx", "pt2": ".pt2", "torchscript": ".ts"}
ONNX_MIN_OPSET = 17  # LayerNormalization is an ONNX op from 17 on
TOLERANCE = 1e-4  # max absolute error against eager, float32 on the CPU (measured: <= 1e-5 for the backbones)
EXPORT_NOTE = ("attention: the reference path (PyTorch SDPA) forced for the export; no Triton kernel, FlexAttention "
               "or fused oneDNN op in any graph")

# Every recipe a preset takes, plus the two bare ablations of the studies: detectron2's abs + relpos in every block
# (relpos) and no position encoding at all (none).
EXTRA_RECIPES = {
    "relpos": dict(pos_embed="abs", window_pos="relpos", global_pos="relpos"),
    "none": dict(pos_embed="none", window_pos="none", global_pos="none"),
}
EXPORT_RECIPES = ("original", "paper", "relpos", "rope", "lookhere", "none")


class _Fp16Op(nn.Module):
    """A Linear or Conv2d that multiplies in float16: its weights stored in float16, its input cast to float16, its
    output float16. What surrounds it (additions, LayerNorm, position terms) computes in the dtype it receives."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(module).half()

    @property
    def weight(self):  # for code that applies the layer's weights itself (EVA-02's masked key bias)
        return self.inner.weight

    @property
    def bias(self):
        return self.inner.bias

    def forward(self, x):
        out = self.inner(x.half())
        # a convolution starts the token stream (the patch embedding): float32 from there, as autocast's additions
        # promote it when a float32 position embedding is added
        return out.float() if isinstance(self.inner, nn.Conv2d) else out


class _Float32LayerNorm(nn.LayerNorm):
    """A LayerNorm that normalizes in float32 whatever its input's dtype (its output is float32)."""

    def forward(self, x):
        return super().forward(x.float())


class Fp16Graph(nn.Module):
    """``model`` for a float16 export: every Linear and Conv2d (nearly all the weights and FLOPs) in float16, the
    token stream between blocks and every LayerNorm in float32 (a float16 input is cast up first). Attention
    takes the float16 q, k and v of the projections. LayerNorm in particular stays float32: TensorRT's
    float16 LayerNorm overflows once an activation passes 256 (its square passes float16's 65504), and the float32
    LayerNormalization nodes of this graph keep a strongly typed TensorRT build from rounding them. The input and
    the outputs stay float32 (the float16 file is a drop-in for the float32 one). ``model`` itself is not
    changed."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.net = copy.deepcopy(model)
        swap = {name: _Fp16Op(m) for name, m in self.net.named_modules() if type(m) in (nn.Linear, nn.Conv2d)}
        if not swap:
            raise WinposError(f"{type(model).__name__} has no Linear or Conv2d layer to run in float16; export it "
                              "with --precision float32")
        for name, m in self.net.named_modules():
            if type(m) is nn.LayerNorm:
                swap[name] = _Float32LayerNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                                               bias=m.bias is not None)
                swap[name].load_state_dict(m.state_dict())
        for name, new in swap.items():
            self.net.set_submodule(name, new)
        for attr in ("in_chans", "patch_size"):  # what the export command reads from a backbone
            if hasattr(model, attr):
                setattr(self, attr, getattr(model, attr))

    def forward(self, x):
        return _to_float(self.net(x))


def _to_float(out):
    if isinstance(out, torch.Tensor):
        return out.float()
    if isinstance(out, dict):
        return {k: _to_float(v) for k, v in out.items()}
    return type(out)(_to_float(v) for v in out)


def fp16_tolerance(model: nn.Module, graph: nn.Module, example: Callable, sizes, max_relative: float = 1e-2) -> tuple[float, float]:
    """The tolerance a float16 export is checked with: twice the eager float16 graph's own max absolute error
    against eager float32 over ``sizes``, plus 1e-4; returns ``(tolerance, eager_error)``. A graph whose eager error
    passes ``max_relative`` of the outputs' largest magnitude (an overflow, a term that float16 cannot hold) is
    refused in one line."""
    errors, scale = [], 0.0
    with export_mode():
        for s in sizes:
            x = example(s)
            refs, outs = _flat(model(x)), _flat(graph(x))
            errors.append(_max_error(outs, refs))
            scale = max([scale] + [float(r.abs().max()) for r in refs if r.numel()])
    worst = _finite_max(errors)
    if not worst <= max_relative * scale:  # also catches inf / nan
        raise WinposError(f"in float16 the model's outputs differ from float32 by {worst:.3g} (largest output "
                          f"{scale:.3g}): above {max_relative:g} of it, float16 does not hold this model; export "
                          "it with --precision float32")
    return 2 * worst + 1e-4, worst


def build_backbone(preset: str, recipe: str, **overrides) -> nn.Module:
    """``winpos.backbones.create(preset, recipe)`` in eval mode; ``relpos`` and ``none`` are the preset's
    ``original`` with those position encodings."""
    from winpos.backbones import create

    check_choice("export recipe", recipe, EXPORT_RECIPES)
    if recipe in EXTRA_RECIPES:
        return create(preset, recipe="original", **{**EXTRA_RECIPES[recipe], **overrides}).eval()
    return create(preset, recipe=recipe, **overrides).eval()


@contextmanager
def export_mode():
    """Reference attention and no fused linear steps, for tracing and for the eager outputs it is compared with."""
    from winpos.backbones.fused import fused_linear

    before = os.environ.get("WINPOS_ATTENTION_BACKEND")
    os.environ["WINPOS_ATTENTION_BACKEND"] = "reference"
    try:
        with fused_linear(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracers' notes on Python values in graphs, one per shape op
            yield
    finally:
        if before is None:
            os.environ.pop("WINPOS_ATTENTION_BACKEND", None)
        else:
            os.environ["WINPOS_ATTENTION_BACKEND"] = before


def require_onnxruntime():
    """onnx and onnxruntime, or the one line that says how to install them."""
    try:
        import onnx  # noqa: F401  (torch.onnx.export needs it)
        import onnxruntime
    except ImportError as e:
        raise WinposError(f"ONNX export needs onnx and onnxruntime ({e.name} is not installed): pip install "
                          "'winpos[export]' (or pip install onnx onnxruntime), or leave onnx out of --formats") from None
    return onnxruntime


def check_onnx_setup(opset: int) -> None:
    """onnx and onnxruntime importable and ``opset`` high enough, or one line saying the fix."""
    require_onnxruntime()
    if opset < ONNX_MIN_OPSET:
        raise WinposError(f"--opset {opset} is below {ONNX_MIN_OPSET}, the first with LayerNormalization; use "
                          f"--opset {ONNX_MIN_OPSET} or higher")


@dataclass
class Artifact:
    """One exported file: its bytes, the input size it takes (None: any size, a dynamic .pt2 program)."""

    format: str
    name: str
    data: bytes
    size: tuple[int, int] | None


@dataclass
class Check:
    format: str
    size: tuple[int, int]
    max_error: float
    name: str


@dataclass
class ExportResult:
    artifacts: list[Artifact] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    tolerance: float = TOLERANCE
    notes: list[str] = field(default_factory=list)
    eager_error: float | None = None  # a float16 export: its graph's own eager error against float32

    @property
    def ok(self) -> bool:
        return all(c.max_error <= self.tolerance for c in self.checks)

    def failure(self) -> str:
        """The one line saying which artifact is furthest above the tolerance."""
        worst = max(self.checks, key=lambda c: c.max_error)
        return (f"{worst.name} differs from eager by {worst.max_error:.2e} at {worst.size[0]}x{worst.size[1]}, above "
                f"the tolerance {self.tolerance:g}; nothing was written (report the table above, or raise "
                "--tolerance if the difference is expected)")

    def table(self) -> str:
        rows = [f"{'format':<12} {'size':>9}  {'max |error|':>11}  file"]
        for c in self.checks:
            flag = "" if c.max_error <= self.tolerance else f"  ABOVE {self.tolerance:g}"
            rows.append(f"{c.format:<12} {c.size[0]:>4}x{c.size[1]:<4}  {c.max_error:11.2e}  {c.name}{flag}")
        return "\n".join(rows)


def planned_names(stem: str, formats, sizes) -> list[str]:
    """Every file name an export may write (a dynamic ``.pt2`` or one per size), for the output check."""
    names = []
    for fmt in formats:
        names += [f"{stem}_{h}x{w}{SUFFIX[fmt]}" for h, w in sizes]
        if fmt == "pt2":
            names.append(f"{stem}{SUFFIX[fmt]}")
    return names + [f"{stem}_export.json"]


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for v in out.values() for t in _flat(v)]
    return [t for v in out for t in _flat(v)]


def _export_failed(fmt: str, e: Exception, hint: str) -> WinposError:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return WinposError(f"the model cannot be exported to {fmt}: {type(e).__name__}: {first[:300]}; {hint}")


@contextmanager
def _quiet_output():
    """stdout and stderr of this process, C++ writes included, discarded inside the block."""
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)  # output-policy: the null device, no file
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def onnx_bytes(model, x, opset: int = ONNX_MIN_OPSET) -> bytes:
    """``torch.onnx.export`` of ``model`` at ``x``'s size (TorchScript-based, ``dynamo=False``) into memory."""
    buf = io.BytesIO()
    try:
        with _quiet_output():  # the exporter prints the whole graph (thousands of lines) when an op fails
            torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=opset,  # output-policy: into memory
                              input_names=["image"])
    except Exception as e:  # an op without an ONNX form in this opset
        raise _export_failed("ONNX", e, f"try a higher --opset (>= {ONNX_MIN_OPSET}) or leave onnx out of "
                                        "--formats (pt2 and torchscript take every op)") from None
    return buf.getvalue()


def _torchscript(model, x) -> bytes:
    buf = io.BytesIO()
    try:
        torch.jit.save(torch.jit.trace(model, (x,), check_trace=False), buf)  # output-policy: into memory
    except Exception as e:
        raise _export_failed("TorchScript", e, "leave torchscript out of --formats") from None
    return buf.getvalue()


def _pt2(model, example, sizes, stride: int, max_side: int = 4096) -> list[tuple[bytes, tuple[int, int] | None]]:
    """A program with dynamic height and width (multiples of ``stride`` up to ``max_side``) where it stays dynamic,
    else one per size. Exported with grad mode on: under ``no_grad`` the program holds a grad-mode switch (RoPE
    builds its tables without gradient) that ``torch.export.load`` then refuses."""
    from torch.export import Dim
    from torch.export import export as _export

    def export(*args, **kwargs):
        with torch.enable_grad():
            return _export(*args, **kwargs)

    def saved(program) -> bytes:
        buf = io.BytesIO()
        torch.export.save(program, buf)  # output-policy: into memory; write_export writes the files
        return buf.getvalue()

    if len(sizes) > 1 and all(h % stride == 0 and w % stride == 0 for h, w in sizes):
        h, w = Dim("h", min=1, max=max_side // stride), Dim("w", min=1, max=max_side // stride)
        try:
            x = example(sizes[0])  # (N, C, H, W) for a backbone, (C, H, W) for a detector
            program = export(model, (x,), dynamic_shapes=({x.dim() - 2: stride * h, x.dim() - 1: stride * w},))
        except Exception:  # a constraint the model's shape arithmetic violates: one program per size instead
            program = None
        if program is not None and _takes_every_size(program, example, sizes):
            return [(saved(program), None)]
    try:
        return [(saved(export(model, (example(s),))), s) for s in sizes]
    except Exception as e:
        raise _export_failed("torch.export", e, "leave pt2 out of --formats") from None


def _takes_every_size(program, example, sizes) -> bool:
    """Whether a program exported with dynamic height and width runs at every size: its guards (the grid
    arithmetic of the position terms) may pin it to the example's grid, which only running it shows."""
    module = program.module()
    try:
        for s in sizes:
            module(example(s))
    except AssertionError:  # "Guard failed: x.size()[2] // 16 == 4"
        return False
    return True


def run_artifact(artifact: Artifact, x: torch.Tensor) -> list[torch.Tensor]:
    """Run an exported artifact on ``x`` (the runtime that loads it: onnxruntime, ``torch.export.load``,
    ``torch.jit.load``); a size the graph was not exported at is refused, naming the sizes it takes."""
    size = tuple(x.shape[-2:])
    if artifact.size is not None and size != tuple(artifact.size):
        raise WinposError(f"{artifact.name} was exported for {artifact.size[0]}x{artifact.size[1]} inputs and cannot "
                          f"take {size[0]}x{size[1]} (its position terms are computed for one grid); export again "
                          f"with --sizes {size[0]}x{size[1]}")
    if artifact.format == "onnx":
        ort = require_onnxruntime()
        session = ort.InferenceSession(artifact.data, providers=["CPUExecutionProvider"])
        return [torch.from_numpy(o) for o in session.run(None, {session.get_inputs()[0].name: x.numpy()})]
    if artifact.format == "pt2":
        from torch.export import load

        return _flat(load(io.BytesIO(artifact.data)).module()(x))
    return _flat(torch.jit.load(io.BytesIO(artifact.data))(x))


def _max_error(outs, refs) -> float:
    if len(outs) != len(refs) or any(tuple(o.shape) != tuple(r.shape) for o, r in zip(outs, refs)):
        return float("inf")
    return _finite_max([float((o.float() - r.float()).abs().max()) if o.numel() else 0.0 for o, r in zip(outs, refs)])


def _finite_max(errors: list[float]) -> float:
    """The largest error, or inf when any is nan or inf: Python's max keeps whichever of nan and a number comes
    first, so a nan would pass a check."""
    return max(errors, default=0.0) if all(math.isfinite(e) for e in errors) else float("inf")


def export_and_check(model: nn.Module, stem: str, sizes, formats=FORMATS, *, example: Callable, stride: int,
                     opset: int = ONNX_MIN_OPSET, tolerance: float = TOLERANCE, exported: dict | None = None,
                     max_side: int = 4096) -> ExportResult:
    """Export ``model`` in each of ``formats`` at each of ``sizes`` and check every artifact against eager.

    Args:
        model: in eval mode; ``model(example(size))`` returns a tensor or a (nested) tuple / list / dict of them.
            Every artifact is checked against it.
        stem: the files' common name.
        sizes: ``[(H, W), ...]`` input sizes in pixels.
        example: ``size -> input tensor``; called afresh for each check (a new random input).
        stride: what H and W must be multiples of (the dynamic ``.pt2``'s constraint).
        exported: ``{format: module}`` where a format exports another module computing the same outputs (a
            detector's ``.pt2`` form); its artifacts are still checked against ``model``.
        max_side: the largest height or width a dynamic ``.pt2`` program is declared for.
    """
    exported = exported or {}
    sizes = [tuple(s) for s in sizes]
    for fmt in formats:
        check_choice("export format", fmt, FORMATS)
    if "onnx" in formats:
        check_onnx_setup(opset)
    result = ExportResult(tolerance=tolerance, notes=[EXPORT_NOTE])
    with export_mode():
        for s in sizes:
            model(example(s))  # an input the model refuses (not a multiple of its stride) fails here, in one line
        for fmt in formats:
            if fmt == "pt2":
                for data, size in _pt2(exported.get(fmt, model), example, sizes, stride, max_side):
                    name = f"{stem}.pt2" if size is None else f"{stem}_{size[0]}x{size[1]}.pt2"
                    result.artifacts.append(Artifact(fmt, name, data, size))
                dynamic = result.artifacts[-1].size is None
                result.notes.append(f"pt2: one program with dynamic height and width (multiples of {stride} up to "
                                    f"{max_side})" if dynamic else
                                    "pt2: one program per size (the position terms specialize the program to its grid)")
                continue
            for s in sizes:
                module = exported.get(fmt, model)
                data = onnx_bytes(module, example(s), opset) if fmt == "onnx" else _torchscript(module, example(s))
                result.artifacts.append(Artifact(fmt, f"{stem}_{s[0]}x{s[1]}{SUFFIX[fmt]}", data, s))
        for artifact in result.artifacts:
            for s in sizes if artifact.size is None else [artifact.size]:
                x = example(s)
                err = _max_error(run_artifact(artifact, x), _flat(model(x)))
                result.checks.append(Check(artifact.format, s, err, artifact.name))
    return result


def write_export(out_dir, stem: str, result: ExportResult, meta: dict, force: bool) -> list[str]:
    """Write the artifacts and ``<stem>_export.json`` (what was checked, the errors, the tolerance) into ``out_dir``,
    complete or absent: nothing is written unless every check is within tolerance."""
    from pathlib import Path

    from winpos.utils.output_folders import staged_outputs
    from winpos.utils.outputs import atomic_write, atomic_write_json

    if not result.ok:
        raise WinposError(result.failure())
    names = [a.name for a in result.artifacts] + [f"{stem}_export.json"]
    with staged_outputs(out_dir, planned=names, force=force, flag="--out") as (_, staging):
        for a in result.artifacts:
            atomic_write(Path(staging) / a.name, lambda f, data=a.data: f.write(data))
        atomic_write_json(Path(staging) / f"{stem}_export.json", {
            **meta, "tolerance": result.tolerance, "notes": result.notes,
            "files": {a.name: {"format": a.format, "size": list(a.size) if a.size else "dynamic"}
                      for a in result.artifacts},
            "checks": [{"file": c.name, "format": c.format, "size": list(c.size), "max_error": c.max_error}
                       for c in result.checks]})
    return names

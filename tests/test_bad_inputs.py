"""Bad inputs to the tools and APIs: each is refused in one line (exit status 2) or handled without losing data.

One test (or parametrized group) per finding of the bad-input review; docs/bad_inputs.md lists the inputs and what
each gets. The command-line checks run the tools in subprocesses (one thread) exactly as a user would.
"""
import os
import resource
import sys
from pathlib import Path

import pytest
import torch

from tests.bad_inputs_helpers import (  # noqa: F401 (detector is a fixture)
    CONFIG, tool, assert_one_line_error, detector, _images, _bytes, _vit, _save_vit,
)


# ------------------------------------------------------------------------------------------------ data loss


def test_predict_refuses_an_output_folder_holding_the_inputs(detector, tmp_path):
    _, _, ckpt = detector
    images = _images(tmp_path / "imgs", ["a.png", "b.png"])
    before = _bytes(images)
    res = tool("predict.py", "--config-file", CONFIG, "--checkpoint", ckpt, "--input", images, "--output", images,
               "train.device=cpu")
    assert_one_line_error(res, "--output", "holds the input")
    assert _bytes(images) == before  # byte-identical, nothing added


def test_predict_gives_same_stem_inputs_distinct_drawings(detector, tmp_path):
    from winpos.d2.predict import predict_images

    cfg, model, _ = detector
    _images(tmp_path / "a", ["x.png"])
    _images(tmp_path / "b", ["x.png", "x.jpg"])
    out = tmp_path / "out"
    records = predict_images(cfg, model, [tmp_path / "a", tmp_path / "b"], out, 0.5)
    drawings = [r["drawing"] for r in records]
    assert len(set(drawings)) == 3 and all(Path(d).is_file() for d in drawings)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["predictions.json", "x-2.png",
                                                                                  "x-3.png", "x.png"]
    assert sorted(p.name for p in out.glob(".*")) == [".winpos-outputs.json", ".winpos-run.lock"]  # no staging


def test_convert_refuses_output_equal_to_input(tmp_path):
    src = tmp_path / "own.pth"
    _save_vit(src)
    before = src.read_bytes()
    res = tool("convert_checkpoint.py", "--input", src, "--output", src, "--to", "vitdet_toy")
    assert_one_line_error(res, "--output", "input")
    assert src.read_bytes() == before


def test_convert_refuses_an_existing_output_unless_forced(tmp_path):
    src, out = tmp_path / "own.pth", tmp_path / "out.pth"
    _save_vit(src)
    out.write_bytes(b"my only copy")
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy")
    assert_one_line_error(res, "already exists", "--force")
    assert out.read_bytes() == b"my only copy"
    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy", "--img-size", 64,
               "--force")
    assert res.returncode == 0, res.stderr
    assert len(torch.load(out, weights_only=True)["model"]) > 50


def test_convert_on_a_full_disk_keeps_the_previous_file(tmp_path):
    """``ulimit -f``: the write fails with EFBIG part-way; the previous output stays whole, no temp file is left."""
    src, out = tmp_path / "own.pth", tmp_path / "out.pth"
    _save_vit(src)
    previous = b"previous complete file"
    out.write_bytes(previous)
    limit = 64 * 1024  # bytes; the converted checkpoint is ~2 MB

    def small_file_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = tool("convert_checkpoint.py", "--input", src, "--output", out, "--to", "vitdet_toy", "--img-size", 64,
               "--force", preexec_fn=small_file_limit)
    assert_one_line_error(res, "could not write", code=1)
    assert out.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.pth", "own.pth"]


def test_atomic_write_shows_no_partial_file_and_cleans_up(tmp_path):
    from winpos.utils.outputs import atomic_write

    target = tmp_path / "w.bin"
    target.write_bytes(b"old")

    def write(f):
        f.write(b"new data")
        assert sorted(os.listdir(tmp_path)) == ["w.bin"] or sys.platform != "linux"  # O_TMPFILE: no name yet

    atomic_write(target, write)
    assert target.read_bytes() == b"new data"

    def fail(f):
        f.write(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, fail)
    assert target.read_bytes() == b"new data" and os.listdir(tmp_path) == ["w.bin"]


def test_atomic_savefig_writes_the_format_of_the_extension_and_refuses_an_unknown_one(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from winpos.errors import WinposError
    from winpos.utils.outputs import atomic_savefig

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    try:
        atomic_savefig(fig, tmp_path / "a.png")
        atomic_savefig(fig, tmp_path / "a.pdf")
        atomic_savefig(fig, tmp_path / "a.SVG")
        atomic_savefig(fig, tmp_path / "noext")
        with pytest.raises(WinposError, match=r"'\.docx'.*\.png"):
            atomic_savefig(fig, tmp_path / "a.docx")
    finally:
        plt.close(fig)
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "a.pdf").read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in (tmp_path / "a.SVG").read_bytes()[:2000]
    assert (tmp_path / "noext").read_bytes()[:4] == b"\x89PNG"
    assert sorted(os.listdir(tmp_path)) == ["a.SVG", "a.pdf", "a.png", "noext"]  # nothing for .docx, no temporaries


# -------------------------------------------------------------------------------------- wrong files, exit 0


def test_format_winpos_reads_a_whole_winpos_detector_checkpoint(detector, tmp_path):
    from winpos.d2.checkpoint import _winpos_net

    _, model, ckpt = detector
    out = tmp_path / "trunk.safetensors"
    res = tool("convert_checkpoint.py", "--input", ckpt, "--output", out, "--to", "hieradet_toy", "--format",
               "winpos", "--img-size", 256, "--pos-embed", "abswin")
    assert res.returncode == 0, res.stderr[-2000:]
    from safetensors.torch import load_file

    written = load_file(str(out))
    prefix, net = _winpos_net(model)
    assert set(written) == set(net.state_dict())
    for k, v in net.state_dict().items():
        torch.testing.assert_close(written[k], v, rtol=0, atol=0, msg=k)


def test_unrecognised_hiera_checkpoint_names_the_real_flag():
    from winpos.checkpoints.hiera import convert_hiera_checkpoint

    with pytest.raises(ValueError, match="--format") as ei:
        convert_hiera_checkpoint({"foo.weight": torch.zeros(2)})
    assert "source=" not in str(ei.value)


def test_output_with_no_tensor_of_the_target_is_an_error(tmp_path):
    src = tmp_path / "head_only.pth"
    torch.save({"model_state": {"head.weight": torch.ones(3, 3), "norm.weight": torch.ones(3)}}, src)
    res = tool("convert_checkpoint.py", "--input", src, "--output", tmp_path / "h.pth", "--to", "hieradet_toy",
               "--format", "hiera")
    assert_one_line_error(res, "none of the checkpoint's 2 tensors", "--format auto")
    assert not (tmp_path / "h.pth").exists()


POS = ["abs", "abswin", "abswin_recursive", "none"]


@pytest.mark.parametrize("family", ["vitdet", "hieradet"])
@pytest.mark.parametrize("fmt", ["auto", "winpos"])
@pytest.mark.parametrize("src_kind,dst_kind", [(a, b) for a in POS for b in POS])
def test_own_checkpoints_convert_between_every_pos_embed(family, fmt, src_kind, dst_kind):
    """Every target tensor is written (position terms missing only from a source without one), nothing of the
    source is dropped unless the target has no embedding, and the report accounts for every tensor truthfully."""
    from tests.helpers import randomize
    from winpos.backbones import create
    from winpos.checkpoints import load_external

    kw = dict(img_size=64, window_size=7) if family == "vitdet" else dict(img_size=64)
    preset = "vitdet_toy" if family == "vitdet" else "hieradet_toy"
    src = randomize(create(preset, pos_embed=src_kind, **kw))
    sd, report = load_external({"model": src.state_dict()}, preset, format=fmt, pos_embed=dst_kind, **kw)
    dst = create(preset, pos_embed=dst_kind, **kw)
    result = dst.load_state_dict(sd, strict=False)
    assert not result.unexpected_keys
    pos_missing = [k for k in result.missing_keys if k.startswith("pos_embed.")]
    assert [k for k in result.missing_keys if not k.startswith("pos_embed.")] == []
    assert bool(pos_missing) == (src_kind == "none" and dst_kind != "none")
    dropped = [k for k, _ in report.unexpected]
    assert bool(dropped) == (dst_kind == "none" and src_kind != "none"), report.summary()
    assert all(k.startswith("pos_embed.") for k in dropped)
    done = len(report.matched) + len(report.converted) + len(report.reshaped)
    assert done == len(sd)
    if src_kind != dst_kind and "none" not in (src_kind, dst_kind) and {src_kind, dst_kind} != {"abswin",
                                                                                                "abswin_recursive"}:
        assert report.converted or report.reshaped, report.summary()  # a change of form is never "matched"
    for k, v in sd.items():
        assert torch.isfinite(v).all(), k


def test_nan_weights_are_refused_by_name(tmp_path):
    from winpos.checkpoints import load_external

    sd = _vit().state_dict()
    sd["blocks.0.attn.qkv.weight"] = torch.full_like(sd["blocks.0.attn.qkv.weight"], float("nan"))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv\.weight"):
        load_external(sd, "vitdet_toy", img_size=64, window_size=7)
    torch.save(sd, tmp_path / "nan.pth")
    res = tool("convert_checkpoint.py", "--input", tmp_path / "nan.pth", "--output", tmp_path / "o.pth", "--to",
               "vitdet_toy", "--img-size", 64)
    assert_one_line_error(res, "NaN", "blocks.0.attn.qkv.weight")
    assert not (tmp_path / "o.pth").exists()


def test_nan_init_checkpoint_is_refused_before_training(detector, tmp_path):
    from winpos.d2.checkpoint import WinposCheckpointer, load_init_checkpoint

    _, model, _ = detector
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    key = next(k for k, v in sd.items() if v.is_floating_point() and v.dim() > 1)
    sd[key][0] = float("inf")
    torch.save({"model": sd}, tmp_path / "inf.pth")
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        load_init_checkpoint(WinposCheckpointer(model), str(tmp_path / "inf.pth"))


# ------------------------------------------------------------------------------------------ random weights


def test_predict_requires_weights(tmp_path):
    images = _images(tmp_path / "imgs", ["a.png"])
    res = tool("predict.py", "--config-file", CONFIG, "--input", images, "--output", tmp_path / "out",
               "train.device=cpu")
    assert_one_line_error(res, "--checkpoint", "--random-weights")
    assert not (tmp_path / "out").exists()


def test_eval_only_requires_weights(tmp_path):
    res = tool("train_net.py", "--config-file", CONFIG, "--eval-only", f"train.output_dir={tmp_path}",
               "train.device=cpu")
    assert_one_line_error(res, "--eval-only", "train.init_checkpoint", "--random-weights")

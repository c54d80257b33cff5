"""The plot verdicts per source format, on checkpoints laid out by the oracle packages (sam2, hiera, timm) and by
winpos's own trainer: abs-win sources say there is nothing to fix, an embedding without window structure says the
bug cannot matter, a broken one names its threshold and a converter command that works when pasted, the native
size comes from the checkpoint (or its run's config.yaml) and is said, and one unreadable checkpoint does not stop
the others."""
import re
import shlex
import warnings

import torch

from tests.conftest import require
from winpos.diagnostics.extract import effective_embeddings
from winpos.diagnostics.report import BROKEN_FRACTION, KEPT_FRACTION, NO_PATTERN_WS, analyze, run_posemb_viz

C = 32  # hieradet_toy's width: with 5 blocks a Hiera of this layout is a hieradet_toy


def planted(c, H, W, w, seed=0):
    """A smooth part plus a w-periodic part: what a trained windowed embedding looks like."""
    g = torch.Generator().manual_seed(seed)
    ys, xs = torch.meshgrid(torch.linspace(0, 1, H), torch.linspace(0, 1, W), indexing="ij")
    smooth = torch.stack([torch.sin(3 * ys * (k % 3 + 1) + xs * (k % 5)) for k in range(c)])
    return smooth + torch.randn(c, w, w, generator=g).tile(1, -(-H // w), -(-W // w))[:, :H, :W]


def sam2_checkpoint(path, zero=False):
    Hiera = require("sam2.modeling.backbones.hieradet").Hiera
    trunk = Hiera(embed_dim=C, num_heads=1, stages=(1, 1, 1, 1), global_att_blocks=(2,),
                  window_pos_embed_bkg_spatial_size=(7, 7))
    if not zero:  # sam2 initializes both parts to zeros
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            trunk.pos_embed.copy_(torch.randn(trunk.pos_embed.shape, generator=g))
            trunk.pos_embed_window.copy_(torch.randn(trunk.pos_embed_window.shape, generator=g))
    torch.save({"model": {"image_encoder.trunk." + k: v for k, v in trunk.state_dict().items()}}, path)
    return path


def hiera_checkpoint(path, grid=None):
    m = require("hiera").Hiera(input_size=(224, 224), embed_dim=C, num_heads=1, stages=(1, 1, 2, 1))
    with torch.no_grad():
        m.pos_embed.copy_((planted(C, 56, 56, 8) if grid is None else grid).flatten(1).T[None])
    torch.save({"model_state": m.state_dict()}, path)
    return path


def verdict_of(path, size, **kw):
    (info,) = effective_embeddings(path, **kw)
    return info, analyze(info, target_sizes=[size])["verdicts"][0]


def test_abswin_sources_have_nothing_to_fix(tmp_path):
    info, text = verdict_of(sam2_checkpoint(tmp_path / "sam2.pt"), 512)
    assert info.native_from == "SAM2 trains at 1024 px"
    assert "abs-win: resizing keeps the windows aligned, nothing to fix (WS 0." in text
    assert "no longer see" not in text and "convert" not in text

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        timm_hiera = require("timm.models.hiera")
    m = timm_hiera.Hiera(img_size=(256, 256), embed_dim=C, num_heads=1, stages=(1, 1, 1, 1),
                         abs_win_pos_embed=True, global_pos_size=(16, 16))
    torch.save(m.state_dict(), tmp_path / "timm_abswin.pth")
    info, text = verdict_of(tmp_path / "timm_abswin.pth", 512)
    assert info.format == "timm_abswin" and "nothing to fix" in text


def test_winpos_detector_native_size_from_its_run(tmp_path):
    """A winpos detector trained at 256 px: the native size is read from the run's config.yaml (or the flag), so
    512 px is shown as the 2x upscale it is, not as a downscale from an assumed 1024."""
    from winpos.backbones import create

    net = create("hieradet_toy", recipe="paper")
    run = tmp_path / "run"
    run.mkdir()
    torch.save({"model": {"backbone.bottom_up.net." + k: v for k, v in net.state_dict().items()}, "iteration": 9},
               run / "model_final.pth")
    info, _ = verdict_of(run / "model_final.pth", 512)
    assert info.image_hw == (1024, 1024) and info.native_from.startswith("assumed")  # nothing says otherwise
    (run / "config.yaml").write_text("dataloader:\n  train:\n    mapper:\n      image_size: 256\n"
                                     "model:\n  backbone:\n    bottom_out: !!python/name:os.system ''\n")
    info, text = verdict_of(run / "model_final.pth", 512)
    assert info.image_hw == (256, 256) and "config.yaml" in info.native_from and info.grid.shape[-1] == 64
    assert "nothing to fix" in text
    info, _ = verdict_of(run / "model_final.pth", 512, resolution=384)
    assert info.image_hw == (384, 384) and "given" in info.native_from


def test_no_window_pattern_and_zero_embedding(tmp_path):
    _, text = verdict_of(sam2_checkpoint(tmp_path / "zero.pt", zero=True), 512)
    assert "no window pattern" in text and "the bug cannot matter for this embedding" in text
    grid = planted(C, 56, 56, 8)  # minus its mean 8x8 tile: a smooth, learned-looking embedding, no window pattern
    smooth = grid - grid.reshape(C, 7, 8, 7, 8).mean((1, 3)).tile(1, 7, 7)
    info, text = verdict_of(hiera_checkpoint(tmp_path / "smooth.pth", smooth), 448)
    res = analyze(info, target_sizes=[448])
    assert res["native"]["ws_centred"] < NO_PATTERN_WS
    assert f"no window pattern (reference WS {res['native']['ws_centred']:.2f} < {NO_PATTERN_WS})" in text


def test_broken_names_its_threshold_and_a_pasteable_fix(tmp_path):
    path = hiera_checkpoint(tmp_path / "hiera_toy.pth")
    info, text = verdict_of(path, 448)
    assert info.native_from == "the stored 56x56 grid x patch size 4 px" and info.presets == ["hieradet_toy"]
    assert "broken:" in text and f"under the {BROKEN_FRACTION:.0%} threshold" in text
    command = shlex.split(re.search(r"fix: (winpos-convert .*)$", text).group(1))
    assert command[command.index("--to") + 1] == "hieradet_toy"
    out = tmp_path / "converted.safetensors"
    command[command.index("--output") + 1] = str(out)
    convert = _tool("convert_checkpoint")
    assert convert.main(command[1:]) == 0 and out.is_file()


def test_weakened_band_names_both_thresholds():
    from winpos.diagnostics.report import verdict

    text = verdict(512, (128, 128), 8, before=0.57, naive=0.41, abswin=0.57)
    assert f"between the {BROKEN_FRACTION:.0%} (broken) and {KEPT_FRACTION:.0%} (kept) thresholds" in text
    assert "naive keeps 72% of WS 0.57" in text


def test_one_bad_checkpoint_does_not_stop_the_others(tmp_path):
    good = sam2_checkpoint(tmp_path / "sam2.pt")
    zero = sam2_checkpoint(tmp_path / "zero.pt", zero=True)
    bad = tmp_path / "notes.pth"
    bad.write_text("not a checkpoint")
    report = run_posemb_viz([good, bad, zero], tmp_path / "viz", sizes=[512], progress=False)
    first, broken, last = report["checkpoints"]
    assert "notes.pth" in broken["error"] and "\n" not in broken["error"]
    assert "nothing to fix" in first["embeddings"][0]["verdicts"][0]
    assert "no window pattern" in last["embeddings"][0]["verdicts"][0]
    assert len(list((tmp_path / "viz").glob("zero_*.png"))) == 3  # a zero embedding is still plotted


def _tool(name):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_converter_global_grid_advice_works_when_pasted(tmp_path, capsys):
    """The converter's 'lossy' line names a flag; passing it makes the conversion exact (nothing reshaped)."""
    convert = _tool("convert_checkpoint")
    path = hiera_checkpoint(tmp_path / "hiera_toy.pth")
    assert convert.main(["--input", str(path), "--output", str(tmp_path / "a.safetensors"), "--to",
                         "hieradet_toy", "--pos-embed", "abswin"]) == 0
    first = capsys.readouterr().out
    flag = re.search(r"convert with (--pos-global-size \d+)", first).group(1).split()
    assert flag == ["--pos-global-size", "56"]
    assert convert.main(["--input", str(path), "--output", str(tmp_path / "b.safetensors"), "--to",
                         "hieradet_toy", "--pos-embed", "abswin", *flag]) == 0
    second = capsys.readouterr().out
    assert "lossy" not in second and "0 missing" in second and "reshaped" not in second.split("\n", 1)[1]
    assert "pos_global_size=56" in second
    from safetensors.torch import load_file

    from winpos.backbones import create

    net = create("hieradet_toy", recipe="original", pos_embed="abswin", pos_global_size=56)
    missing, unexpected = net.load_state_dict(load_file(str(tmp_path / "b.safetensors")), strict=False)
    assert not unexpected and net.pos_embed.global_embed.shape[-1] == 56


def test_zero_embedding_figure_says_constant_not_too_few_windows(tmp_path, monkeypatch):
    from winpos.diagnostics import plots

    texts = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, pdf: texts.extend(
        t.get_text() for ax in fig.axes for t in ax.texts) or [path])
    (info,) = effective_embeddings(sam2_checkpoint(tmp_path / "zero.pt", zero=True))
    plots.plot_window_similarity(plots.states_at(info, 512), 8, tmp_path / "ws.png")
    assert len(texts) == 6 and all("constant over positions" in t for t in texts), texts

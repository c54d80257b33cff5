"""The reproduction's definitions and checkpoints (winpos.experiments.protocol / checkpoints): geometry and data,
refusals before any work, and the conversions of an absolute embedding (exact abs-win, the zero-window control,
the recursive form) checked against the naive resize they are compared with."""
import json
from pathlib import Path

import pytest
import torch

from winpos.diagnostics.metrics import naive_resize, window_similarity
from winpos.errors import WinposError
from winpos.experiments import checkpoints as C
from winpos.experiments import protocol as P

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")
SMALL = dict(image_size=64, train_images=8, val_images=4, min_objects=1, max_objects=3)


def spec(tmp_path, encoding="abs_learned", **kw):
    return dict(name="t", kind="detect", config=CONFIG, encoding=encoding, size=64, shapes=dict(SMALL), iters=2,
                seed=0, out=str(tmp_path / encoding), lr=1e-3, init="", threads=1, **kw)


@pytest.mark.parametrize("k,size", [(1, 64), (1.25, 80), (1.5, 96), (2, 128), (4, 256)])
def test_multipliers_that_the_windows_tile(k, size):
    assert P.check_multiplier(k) == size


@pytest.mark.parametrize("k,message", [(1.1, "17.6x17.6 token grid"), (1.125, "18x18 token grid"),
                                       (0.5, "must be a number >= 1"), ("2", "must be a number"),
                                       (True, "must be a number")])
def test_multipliers_that_do_not_fit_are_refused(k, message):
    with pytest.raises(WinposError, match=message):
        P.check_multiplier(k)


def test_canvas_keeps_object_sizes_and_density_upscaled_keeps_the_images():
    canvas = P.dataset_params(2, "canvas")
    assert canvas == dict(image_size=128, object_side=64, train_images=500, val_images=50, min_objects=4,
                          max_objects=24)
    assert P.dataset_params(4, "canvas")["max_objects"] == 96
    assert P.dataset_params(4, "upscaled") == P.PRETRAIN_SHAPES
    with pytest.raises(WinposError, match="unknown condition 'bigger'"):
        P.dataset_params(2, "bigger")


@pytest.mark.parametrize("kwargs,message", [
    (dict(rows=("naive", "absolute")), r"unknown row\(s\) \['absolute'\]"),
    (dict(rows=()), "rows is empty"),
    (dict(seeds=(0, 0)), r"seeds lists \['0'\] more than once"),
    (dict(multipliers=(2, 2.0)), "multipliers lists"),
    (dict(conditions=("canvas", "canvas")), "conditions lists"),
    (dict(seeds=(-1,)), "seed -1 must be an int >= 0"),
    (dict(conditions=("zoomed",)), r"unknown condition\(s\) \['zoomed'\]"),
    (dict(multipliers=(2, 1.1)), "windows do not tile"),
    (dict(finetune_iters=0), "finetune_iters=0 must be a positive int"),
    (dict(config="nope.py"), "config 'nope.py' does not exist"),
    (dict(pretrain_lr=0), "pretrain_lr=0 must be a learning rate"),
    (dict(stage0_mask_ratio=1.0), "stage0_mask_ratio=1.0 must be in"),
])
def test_protocol_refuses_bad_settings_before_writing(kwargs, message, tmp_path):
    from winpos.experiments.reproduce import run_protocol

    p = P.Protocol(**{"config": CONFIG, "output_dir": str(tmp_path / "out"), **kwargs})
    with pytest.raises(WinposError, match=message):
        run_protocol(p, log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_stage1_starts_from_the_stage0_trunk_except_the_planted_control(tmp_path):
    p = P.Protocol(config=CONFIG, output_dir=str(tmp_path))
    trunk = str(Path(P.stage0_spec(p)["out"]) / "backbone.pth")
    assert all(P.stage1_spec(p, e)["init"] == trunk for e in ("abs_learned", "rope", "lookhere", "relpos"))
    assert P.stage1_spec(p, "abs_planted")["init"] == ""
    s2 = P.stage2_spec(p, "control", 1.5, "canvas", 3)
    assert s2["convert"] == "control" and s2["size"] == 96 and s2["seed"] == 3
    assert s2["init"] == P.converted_init(p, "control") != P.converted_init(p, "abs2win")


def test_the_folder_of_a_protocol_refuses_another_protocol(tmp_path):
    from winpos.experiments.reproduce import claim_folder

    p = P.Protocol(config=CONFIG, output_dir=str(tmp_path / "o"), rows=("naive",))
    claim_folder(p)
    claim_folder(P.Protocol(config=CONFIG, output_dir=str(tmp_path / "o"), rows=("naive", "abs2win"), seeds=(7,)))
    with pytest.raises(WinposError, match="other settings .*finetune_iters 99 here, 150 there"):
        claim_folder(P.Protocol(config=CONFIG, output_dir=str(tmp_path / "o"), finetune_iters=99))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("someone's")
    with pytest.raises(WinposError, match="not empty and holds no protocol.json"):
        claim_folder(P.Protocol(config=CONFIG, output_dir=str(tmp_path / "other")))


def _embedding(model, hw):
    with torch.no_grad():
        return model.backbone.bottom_up.net.pos_embed(hw)[0].permute(2, 0, 1)  # (1, H, W, C) -> (C, H, W)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    src = tmp / "start.pth"
    ws = C.planted_start(spec(tmp, "abs_planted"), str(src), *P.PLANTED_START)
    return tmp, src, ws


def _model(tmp, sd, convert=None, size=64):
    from winpos.d2.engine import build_model

    model = build_model(P.build_cfg(dict(spec(tmp), convert=convert, size=size)))
    model.load_state_dict(sd)
    return model


def test_the_three_conversions_keep_the_64px_model_and_differ_only_where_they_should(planted):
    tmp, src, ws = planted
    assert ws["ws"] > 0.7 and ws["ws_naive_2x"] < 0.2 and ws["ws_abswin_2x"] > 0.7
    naive = _model(tmp, torch.load(src, weights_only=True)["model"])
    E16 = _embedding(naive, (16, 16))
    for how in C.CONVERSIONS:
        dst = tmp / f"{how}.pth"
        C.convert(str(src), str(dst), how)
        sd = torch.load(dst, weights_only=True)["model"]
        assert P.EMBED_KEY + "pos_embed" not in sd and P.EMBED_KEY + "window_embed" in sd
        model = _model(tmp, sd, convert=how)
        # at the pretraining grid every conversion adds the same embedding
        torch.testing.assert_close(_embedding(model, (16, 16)), E16, rtol=0, atol=1e-6)
        for g in (20, 24, 32, 64):  # 1.25x, 1.5x, 2x, 4x
            E = _embedding(model, (g, g))
            ws_g = window_similarity(E, P.WINDOW, centred=True)
            if how == "control":  # naive interpolation exactly, plus a zero window parameter
                torch.testing.assert_close(E, naive_resize(E16, (g, g)), rtol=0, atol=1e-5)
                assert ws_g < 0.3, (g, ws_g)
            elif how == "recursive":  # the 16x16 embedding tiled with its own period
                torch.testing.assert_close(E[:, :16, :16], E16, rtol=0, atol=1e-6)
                rows = min(16, g - 16)
                torch.testing.assert_close(E[:, 16:16 + rows, :16], E16[:, :rows, :], rtol=0, atol=1e-6)
                assert ws_g > 0.7, (g, ws_g)
            else:
                assert ws_g > 0.7, (g, ws_g)


def test_conversion_refuses_a_checkpoint_without_an_absolute_embedding(tmp_path):
    from winpos.d2.engine import build_model

    model = build_model(P.build_cfg(spec(tmp_path, "rope")))
    src = tmp_path / "rope.pth"
    torch.save({"model": model.state_dict()}, src)
    with pytest.raises(WinposError, match="no backbone.bottom_up.net.pos_embed.pos_embed"):
        C.convert(str(src), str(tmp_path / "out.pth"), "abswin")
    with pytest.raises(WinposError, match="unknown conversion 'tiled'"):
        C.convert(str(src), str(tmp_path / "out.pth"), "tiled")
    (tmp_path / "bad.pth").write_bytes(b"no checkpoint")
    with pytest.raises(WinposError, match="not a readable checkpoint"):
        C.convert(str(tmp_path / "bad.pth"), str(tmp_path / "out.pth"), "abswin")
    assert not (tmp_path / "out.pth").exists()


def test_export_writes_fp16_weights_and_a_manifest_the_demo_checks(planted, tmp_path):
    from winpos.experiments.demo import check_stage1

    _, src, _ = planted
    dst = tmp_path / "ship" / "stage1.pth"
    dst.parent.mkdir()
    info = C.export_stage1(str(src), str(dst), {"command": "python tools/reproduce.py --test", "stage0": None})
    manifest = dst.with_suffix(".json")
    assert json.loads(manifest.read_text()) == info and info["command"] == "python tools/reproduce.py --test"
    assert info["window_structure"]["ws"] > 0.7
    sd = torch.load(dst, weights_only=True)["model"]
    assert all(v.dtype == torch.float16 for v in sd.values() if v.is_floating_point())
    assert check_stage1(str(dst), str(manifest))["sha256"] == info["sha256"]
    with pytest.raises(WinposError, match="already exists|exists"):  # never replaced without force
        C.export_stage1(str(src), str(dst), {"command": "again"})
    assert json.loads(manifest.read_text())["command"] == "python tools/reproduce.py --test"
    data = bytearray(dst.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dst.write_bytes(bytes(data))
    with pytest.raises(WinposError, match="corrupt or was replaced"):
        check_stage1(str(dst), str(manifest))
    with pytest.raises(WinposError, match="is missing; restore it"):
        check_stage1(str(tmp_path / "gone.pth"), str(manifest))
    manifest.write_text("{")
    with pytest.raises(WinposError, match="is not valid"):
        check_stage1(str(dst), str(manifest))


def test_experiments_modules_import_each_other_without_a_circle():
    """The room's files form a DAG: protocol imports none of them; nothing imports the CLI-level modules back."""
    import ast

    pkg = ROOT / "winpos" / "experiments"
    graph = {}
    for f in pkg.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("winpos.experiments"):
                mod = node.module.split(".")
                deps |= {mod[2]} if len(mod) > 2 else {a.name for a in node.names}
        graph[f.stem] = deps - {f.stem}
    assert graph["protocol"] == set()
    done = set()

    def visit(n, path):
        assert n not in path, f"import circle: {' -> '.join(path + [n])}"
        if n in done:
            return
        for d in graph.get(n, ()):
            visit(d, path + [n])
        done.add(n)

    for n in graph:
        visit(n, [])

"""The bug-reproduction protocol (winpos.d2.reproduce, tools/reproduce.py): geometry and data checks, the exact
abs -> abs-win conversion (it must keep a window-periodic embedding periodic at a larger grid, where naive
interpolation destroys it), the shipped-checkpoint manifest, one real run end to end, and the CLI's bad inputs."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from winpos.d2 import reproduce as R
from winpos.d2 import reproduce_checkpoints as C
from winpos.d2.reproduce_report import compare_pairs, format_pairs, format_table, format_zero_shot, plot_results
from winpos.diagnostics.metrics import naive_resize, window_similarity
from winpos.errors import WinposError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "shapes" / "reproduce_hieradet.py")
SMALL = dict(image_size=64, train_images=8, val_images=4, min_objects=1, max_objects=3)


def _spec(tmp_path, encoding="abs", **kw):
    return dict(name="t", config=CONFIG, encoding=encoding, size=64, shapes=dict(SMALL), iters=2, seed=0,
                out=str(tmp_path / encoding), lr=1e-3, **kw)


@pytest.mark.parametrize("k,size", [(1, 64), (1.5, 96), (2, 128), (4, 256)])
def test_multipliers_that_the_windows_tile(k, size):
    assert R.check_multiplier(k) == size


@pytest.mark.parametrize("k,message", [(1.1, "17.6x17.6 token grid"), (1.125, "18x18 token grid"),
                                       (0.5, "must be a number >= 1"), ("2", "must be a number"),
                                       (True, "must be a number")])
def test_multipliers_that_do_not_fit_are_refused(k, message):
    with pytest.raises(WinposError, match=message):
        R.check_multiplier(k)


def test_canvas_keeps_object_sizes_and_density_upscaled_keeps_the_images():
    canvas = R.dataset_params(2, "canvas")
    assert canvas == dict(image_size=128, object_side=64, train_images=500, val_images=50, min_objects=4,
                          max_objects=24)
    assert R.dataset_params(4, "canvas")["max_objects"] == 96
    assert R.dataset_params(4, "upscaled") == R.PRETRAIN_SHAPES
    with pytest.raises(WinposError, match="unknown condition 'bigger'"):
        R.dataset_params(2, "bigger")


@pytest.mark.parametrize("kwargs,message", [
    (dict(rows=("abs", "absolute")), r"unknown row\(s\) \['absolute'\]"),
    (dict(conditions=("zoomed",)), r"unknown condition\(s\) \['zoomed'\]"),
    (dict(multipliers=(2, 1.1)), "windows do not tile"),
    (dict(seeds=()), "no seeds given"),
    (dict(finetune_iters=0), "finetune_iters=0 must be a positive int"),
    (dict(config="nope.py"), "config 'nope.py' does not exist"),
    (dict(pretrain_lr=0), "pretrain_lr=0 must be a learning rate"),
    (dict(pretrain_init="gone.pth", rows=("abs_periodic",)), "--pretrain-init 'gone.pth' does not exist"),
    (dict(pretrain_init=CONFIG, rows=("abs", "abswin")), "rows of one pretrained encoding"),
])
def test_protocol_refuses_bad_settings_before_writing(kwargs, message, tmp_path):
    p = R.Protocol(**{"config": CONFIG, "output_dir": str(tmp_path / "out"), **kwargs})
    with pytest.raises(WinposError, match=message):
        R.run_protocol(p, log=lambda m: None)
    assert not (tmp_path / "out").exists()


def test_after_stage1_runs_between_the_stages(tmp_path, monkeypatch):
    """``--export-stage1`` happens as soon as stage 1 is done, before any stage-2 run."""
    events = []

    def fake_pool(specs, workers, log):
        events.append([s["name"].split("/")[0] for s in specs])
        return [{"spec": s, "bbox": {"AP": 1.0}, "segm": {"AP": 1.0}} for s in specs]

    monkeypatch.setattr(R, "_pool", fake_pool)
    monkeypatch.setattr(R, "_stage1_info", lambda p, encs, strict=True: {e: {"checkpoint": "x", "window_structure": None}
                                                                        for e in encs})
    p = R.Protocol(config=CONFIG, output_dir=str(tmp_path / "out"), rows=("rope",), multipliers=(2,),
                   conditions=("canvas",), seeds=(0,), zero_shot=False)
    R.run_protocol(p, log=lambda m: None, after_stage1=lambda: events.append("exported"))
    assert events == [["stage1"], "exported", ["rope"]]


def _embedding(model, hw):
    with torch.no_grad():
        return model.backbone.bottom_up.net.pos_embed(hw)[0].permute(2, 0, 1)  # (1, H, W, C) -> (C, H, W)


def test_periodic_start_and_its_exact_abs_to_abswin_conversion(tmp_path):
    from winpos.d2.engine import build_model

    spec = _spec(tmp_path, "abs_periodic")
    start = tmp_path / "start.pth"
    ws = C.periodic_start(spec, str(start))
    assert ws["ws"] > 0.7 and ws["ws_naive_2x"] < 0.2 and ws["ws_naive_4x"] < 0.2
    assert ws["ws_abswin_2x"] > 0.7 and ws["ws_abswin_4x"] > 0.7  # what the converted model adds at 2x / 4x

    conv = tmp_path / "conv.pth"
    C.convert_abs_to_abswin(str(start), str(conv))
    sd_abs = torch.load(start, weights_only=True)["model"]
    sd_win = torch.load(conv, weights_only=True)["model"]
    assert set(sd_win) == set(sd_abs) - {"backbone.bottom_up.net.pos_embed.pos_embed"} | {
        "backbone.bottom_up.net.pos_embed.global_embed", "backbone.bottom_up.net.pos_embed.window_embed"}
    naive = build_model(R.build_cfg(spec))
    naive.load_state_dict(sd_abs)
    fixed = build_model(R.build_cfg(dict(spec, converted=True)))
    fixed.load_state_dict(sd_win)
    # at the pretraining grid the converted model adds the same embedding
    torch.testing.assert_close(_embedding(fixed, (16, 16)), _embedding(naive, (16, 16)), rtol=0, atol=1e-6)
    for k in (2, 4):
        hw = (16 * k, 16 * k)
        ws_naive = window_similarity(_embedding(naive, hw), R.WINDOW, centred=True)
        ws_fixed = window_similarity(_embedding(fixed, hw), R.WINDOW, centred=True)
        assert ws_naive < 0.2 < 0.7 < ws_fixed, (k, ws_naive, ws_fixed)
        # naive interpolation is what the diagnostics call naive: bicubic of the 16x16 grid
        torch.testing.assert_close(_embedding(naive, hw), naive_resize(_embedding(naive, (16, 16)), hw),
                                   rtol=0, atol=1e-5)


def test_conversion_refuses_a_checkpoint_without_an_absolute_embedding(tmp_path):
    from winpos.d2.engine import build_model

    model = build_model(R.build_cfg(_spec(tmp_path, "rope")))
    src = tmp_path / "rope.pth"
    torch.save({"model": model.state_dict()}, src)
    with pytest.raises(WinposError, match="no backbone.bottom_up.net.pos_embed.pos_embed"):
        C.convert_abs_to_abswin(str(src), str(tmp_path / "out.pth"))
    assert not (tmp_path / "out.pth").exists()


def test_export_writes_fp16_weights_and_a_manifest_the_demo_checks(tmp_path):
    from winpos.d2.demo import check_stage1
    from winpos.d2.engine import build_model

    p = R.Protocol(config=CONFIG, output_dir=str(tmp_path))
    out = Path(R.stage1_spec(p, "abs_periodic")["out"])
    out.mkdir(parents=True)
    C.periodic_start(_spec(tmp_path, "abs_periodic"), str(out / "model_final.pth"))
    dst = tmp_path / "ship" / "stage1.pth"
    dst.parent.mkdir()
    info = C.export_stage1(p, "abs_periodic", str(dst), "python tools/reproduce.py --test")
    manifest = dst.with_suffix(".json")
    assert json.loads(manifest.read_text()) == info
    assert info["command"] == "python tools/reproduce.py --test" and info["seed"] == 0
    assert info["window_structure"]["ws"] > 0.7
    sd = torch.load(dst, weights_only=True)["model"]
    assert all(v.dtype == torch.float16 for v in sd.values() if v.is_floating_point())
    build_model(R.build_cfg(_spec(tmp_path, "abs"))).load_state_dict(sd)  # loads into the fp32 detector
    assert check_stage1(str(dst), str(manifest))["sha256"] == info["sha256"]

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


def test_one_run_end_to_end_in_its_own_process_and_resumed(tmp_path):
    spec = _spec(tmp_path, "abs_periodic")
    logs = []
    out = R._launch(spec, logs.append)
    assert set(out["bbox"]) >= {"AP", "AP50"} and set(out["segm"]) >= {"AP"}
    assert out["spec"]["iters"] == 2 and logs[0] == "start t" and logs[1].startswith("done  t: box AP")
    result = Path(spec["out"]) / "result.json"
    assert json.loads(result.read_text()) == out
    assert (Path(spec["out"]) / "init_periodic.pth").is_file()
    # a finished run is not run again; without its result file it is re-evaluated, not retrained
    assert R._launch(spec, logs.append) == out and len(logs) == 2
    result.unlink()
    again = R._launch(spec, logs.append)
    assert again["bbox"]["AP"] == pytest.approx(out["bbox"]["AP"], abs=1e-9)
    assert (Path(spec["out"]) / "log.txt").read_text().count("Starting training from iteration 0") == 1


def test_a_failed_run_names_its_log(tmp_path):
    spec = _spec(tmp_path, "abs", init=str(tmp_path / "missing.pth"))
    with pytest.raises(WinposError, match=r"run t failed \(exit 1\); its log: .*abs/log.txt"):
        R._launch(spec, lambda m: None)


def test_table_and_plot_from_a_summary(tmp_path):
    def cell(*box):
        return {"box": list(box), "mask": [b / 2 for b in box], "box_mean": sum(box) / len(box), "box_std": 1.0,
                "mask_mean": sum(box) / len(box) / 2, "mask_std": 0.5}

    ws = {"ws": 0.8, "ws_naive_2x": 0.07, "ws_naive_4x": 0.0, "ws_abswin_2x": 0.79, "ws_abswin_4x": 0.78}
    summary = {"protocol": {"finetune_iters": 100, "seeds": [0, 1, 2]},
               "stage1": {"abs_periodic": {"window_structure": ws},
                          "rope": {"window_structure": None}},
               "stage2": {"abs_periodic": {"canvas": {"2x": cell(10, 12, 14)}, "upscaled": {"2x": cell(20, 22)}},
                          "abs_periodic2win": {"canvas": {"2x": cell(30, 32, 34)}},
                          "rope": {"upscaled": {"2x": cell(25, 26)}, "canvas": {"2x": cell(24)}}}}
    summary["stage1"]["abs_periodic2win"] = summary["stage1"]["abs_periodic"]
    table = format_table(summary).splitlines()
    assert table[0].startswith("| row | stage-1 WS@4") and "canvas 2x" in table[0] and "upscaled 2x" in table[0]
    assert "| (a') periodic-start abs, naive | 0.80 (naive: 0.07 / 0.00) | 12.0 ± 1.0 / 6.0 ± 0.5 | 21.0" in table[2]
    assert table[2].endswith("(n=2) |")  # two of the protocol's three seeds
    assert "0.80 (abswin: 0.79 / 0.78) | 32.0 ± 1.0 / 16.0 ± 0.5 |" in table[3] and table[3].endswith("| - |")
    assert "n/a (no embedding) | 24.0 / 12.0 (1 seed) | 25.5" in table[4]  # one seed: no spread shown
    summary["zero_shot"] = {"abs_periodic": {"canvas": {"2x": {"box": 3.0, "mask": 2.0}}}}
    summary["stage1"]["abs_periodic"].update(box_AP_64px=19.6, box_AP_64px_no_embedding=4.2)
    zs = format_zero_shot(summary).splitlines()
    assert zs[0] == "| row | 64 px box AP (embedding zeroed) | canvas 2x box / mask AP |"
    assert zs[2] == "| (a') periodic-start abs, naive | 19.6 (4.2) | 3.0 / 2.0 |"
    plot_results(summary, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 10000


def test_converted_rows_are_compared_with_their_naive_partner_per_seed():
    def cell(seeds, box):
        m = sum(box) / len(box)
        sd = (sum((b - m) ** 2 for b in box) / (len(box) - 1)) ** 0.5 if len(box) > 1 else 0.0
        return {"box": box, "mask": box, "seeds": seeds, "box_mean": m, "box_std": sd, "mask_mean": m, "mask_std": sd}

    summary = {"stage2": {"abs": {"canvas": {"2x": cell([0, 1, 2], [10.0, 12.0, 14.0])},
                                  "upscaled": {"2x": cell([0], [5.0])}},
                          "abs2win": {"canvas": {"2x": cell([0, 1, 2], [15.0, 16.0, 17.0])},
                                      "upscaled": {"2x": cell([0], [6.0])}},
                          "abs_strong": {"canvas": {"2x": cell([0, 2], [20.0, 21.0])}},
                          "abs_strong2win": {"canvas": {"2x": cell([1, 2], [19.0, 22.0])}}},
               "zero_shot": {"abs": {"canvas": {"2x": {"box": 8.0, "mask": 1.0}}},
                             "abs2win": {"canvas": {"2x": {"box": 9.5, "mask": 1.0}}}}}
    pairs = {(e["converted"], e["condition"]): e for e in compare_pairs(summary)}
    big = pairs[("abs2win", "canvas")]
    assert big["delta"] == pytest.approx(4.0) and big["per_seed"] == pytest.approx([5.0, 4.0, 3.0])
    assert big["spread"] == pytest.approx(2.0) and big["beyond_spread"] and big["zero_shot"] == pytest.approx(1.5)
    one = pairs[("abs2win", "upscaled")]
    assert one["per_seed"] == [1.0] and one["spread"] is None and one["beyond_spread"] is None
    strong = pairs[("abs_strong2win", "canvas")]  # seeds paired by number, not by position
    assert strong["per_seed"] == [1.0] and strong["beyond_spread"] is False  # +0.0 mean difference vs std 2.1
    table = format_pairs(summary).splitlines()
    assert "| (b) - (a) | canvas 2x | +4.0 (+5.0, +4.0, +3.0) | 2.0 | yes | +1.5 |" in table
    assert "| (b) - (a) | upscaled 2x | +1.0 (+1.0) | - | 1 seed: no spread | - |" in table
    assert "| (b'') - (a'') | canvas 2x | +0.0 (+1.0) | 2.1 | no | - |" in table


def _refused(tool, args, tmp_path):
    """Run ``tools/<tool>`` with ``--output tmp/o`` and ``args``; it must exit 2 without a traceback and without
    creating the output. Returns its stderr lines."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / tool), "--output", str(tmp_path / "o"), *args],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists()
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.mark.parametrize("args,message", [
    (["--rows", "abs,nope"], "unknown row(s) ['nope']"),
    (["--multipliers", "2,1.1"], "do not tile"),
    (["--multipliers", "two"], "--multipliers: expected comma-separated numbers"),
    (["--seeds", "a"], "--seeds: expected comma-separated integer seeds"),
    (["--finetune-iters", "0"], "--finetune-iters"),
    (["--export-stage1", "abs"], "must be ENCODING:PATH"),
    (["--pretrain-init", "gone.pth", "--rows", "abs_periodic"], "--pretrain-init 'gone.pth' does not exist"),
    (["--pretrain-lr", "0", "--rows", "abs"], "pretrain_lr=0.0 must be a learning rate"),
])
def test_reproduce_cli_bad_input_is_one_line_and_writes_nothing(args, message, tmp_path):
    lines = _refused("reproduce.py", args, tmp_path)
    assert message in lines[-1] and lines[-1].startswith(("error:", "usage:")) or message in "\n".join(lines)


def test_demo_refuses_an_output_that_is_a_file(tmp_path):
    (tmp_path / "o").write_text("not a folder")
    ship = ROOT / "tools" / "checkpoints"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "run_demo.py"), "--output", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --output {tmp_path / 'o'} is a file")
    assert (tmp_path / "o").read_text() == "not a folder" and ship.is_dir()


@pytest.mark.parametrize("args,message", [
    (["--lr", "0"], "--lr 0.0 must be a learning rate in (0, 1)"),
    (["--lr", "nan"], "--lr"),
    (["--iters", "0"], "--iters"),
    (["--seeds", "x"], "--seeds"),
])
def test_demo_bad_arguments_are_one_line_and_write_nothing(args, message, tmp_path):
    assert message in _refused("run_demo.py", args, tmp_path)[-1]


@pytest.mark.parametrize("what", ["missing", "corrupt"])
def test_demo_refuses_a_missing_or_corrupt_shipped_checkpoint(what, tmp_path):
    ckpt, manifest = tmp_path / "s.pth", tmp_path / "s.json"
    if what == "corrupt":
        ckpt.write_bytes(b"not the shipped weights")
        manifest.write_text(json.dumps({"sha256": "0" * 64}))
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "run_demo.py"), "--output", str(tmp_path / "o"),
                           "--checkpoint", str(ckpt), "--manifest", str(manifest)], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: stage-1 checkpoint") and ("is missing" if what == "missing" else "corrupt") in line
    assert not (tmp_path / "o").exists()


def test_masked_token_pretraining_writes_a_detector_it_trained(tmp_path):
    """Stage 1a runs in its own process (the embedded datasets are registered once per process)."""
    spec = _spec(tmp_path, "abs")
    dst = tmp_path / "mim.pth"
    code = ("import json, sys; from winpos.d2.masked_pretrain import pretrain_masked; "
            "print(json.dumps(pretrain_masked(json.loads(sys.argv[1]), 3, sys.argv[2], batch=4)))")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(spec), str(dst)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < info["loss_last100"] < 10
    from winpos.d2.engine import build_model

    torch.manual_seed(spec["seed"])  # the same start as pretrain_masked's
    fresh = build_model(R.build_cfg(spec)).state_dict()
    trained = torch.load(dst, weights_only=True)["model"]
    assert set(trained) == set(fresh)
    heads = [k for k in fresh if k.startswith(("roi_heads.", "proposal_generator."))]
    trunk = [k for k in fresh if k.startswith("backbone.bottom_up.net.")]
    assert heads and all(torch.equal(trained[k], fresh[k]) for k in heads)  # stage 1a trains the trunk only
    assert not torch.equal(trained["backbone.bottom_up.net.pos_embed.pos_embed"],
                           fresh["backbone.bottom_up.net.pos_embed.pos_embed"])
    assert sum(not torch.equal(trained[k], fresh[k]) for k in trunk) > len(trunk) // 2


def test_a_continued_stage1_starts_from_its_init_and_records_it(tmp_path):
    first = tmp_path / "first.pth"
    C.periodic_start(_spec(tmp_path, "abs_periodic"), str(first))
    first.with_suffix(".json").write_text(json.dumps({"iterations": 8000, "command": "python tools/reproduce.py A"}))
    p = R.Protocol(config=CONFIG, output_dir=str(tmp_path / "o"), rows=("abs_periodic", "abs_periodic2win"),
                   pretrain_iters=4000, pretrain_lr=5e-4, pretrain_init=str(first), mim_iters=100)
    p.validate()
    spec = R.stage1_spec(p, "abs_periodic")
    assert spec["init"] == str(first) and spec["mim_iters"] == 0 and spec["lr"] == 5e-4  # no periodic/masked start
    out = Path(spec["out"])
    out.mkdir(parents=True)
    (out / "model_final.pth").write_bytes(first.read_bytes())
    info = C.export_stage1(p, "abs_periodic", str(tmp_path / "ship.pth"), "python tools/reproduce.py B")
    assert info["iterations"] == 4000 and info["iterations_total"] == 12000
    before = info["continued_from"]
    assert before["file"] == "first.pth" and before["manifest"]["command"] == "python tools/reproduce.py A"
    assert before["sha256"] == hashlib.sha256(first.read_bytes()).hexdigest()


def test_the_shipped_checkpoint_matches_its_manifest():
    from winpos.d2.demo import check_stage1

    ship = ROOT / "tools" / "checkpoints"
    info = check_stage1(str(ship / "stage1_hieradet_abs_periodic_64px.pth"),
                        str(ship / "stage1_hieradet_abs_periodic_64px.json"))
    assert info["encoding"] == "abs_periodic" and info["command"].startswith("python tools/reproduce.py")
    measured = C.window_structure(str(ship / "stage1_hieradet_abs_periodic_64px.pth"))
    assert measured == pytest.approx(info["window_structure"], abs=1e-9)
    # what the demo relies on: window structure that naive 2x interpolation destroys
    assert measured["ws"] > 0.15 and measured["ws_naive_2x"] < 0.05 and measured["ws_abswin_2x"] > 0.15


def test_zero_shot_evaluates_the_start_without_training_and_can_zero_the_embedding(tmp_path):
    start = tmp_path / "start.pth"
    C.periodic_start(_spec(tmp_path, "abs_periodic"), str(start))
    spec = dict(_spec(tmp_path, "abs_periodic"), name="z", iters=0, init=str(start), size=128,
                out=str(tmp_path / "zero-shot"))
    out = R._launch(spec, lambda m: None)
    log = (tmp_path / "zero-shot" / "log.txt").read_text()
    assert "AP" in out["bbox"] and "Starting training" not in log and "set to zero" not in log
    ablated = R._launch(dict(spec, zero_embedding=True, out=str(tmp_path / "ablated")), lambda m: None)
    assert "token embedding set to zero (12288 values)" in (tmp_path / "ablated" / "log.txt").read_text()
    assert "AP" in ablated["bbox"]
    with pytest.raises(WinposError, match="failed(.|\n)*this model has none"):
        R._launch(dict(spec, encoding="rope", zero_embedding=True, out=str(tmp_path / "rope")), lambda m: None)


def test_pool_hands_free_cores_to_the_runs_still_going(tmp_path, monkeypatch):
    """Once no run is left to start, each run that ends writes the remaining runs' new thread share, also into a
    folder the run has not made yet (its process is still starting); a stale file from an earlier pool is removed
    before a run starts (it must begin at one thread)."""
    import threading

    release = {n: threading.Event() for n in "abc"}
    seen = {}

    def fake_launch(spec, log):
        release[spec["name"]].wait(10)
        share = Path(spec["out"]) / R.THREADS_FILE
        seen[spec["name"]] = share.read_text() if share.is_file() else None
        return {"name": spec["name"]}

    from winpos.d2 import run_pool

    monkeypatch.setattr(run_pool, "launch", fake_launch)
    specs = [dict(name=n, out=str(tmp_path / n)) for n in "abc"]
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / R.THREADS_FILE).write_text("7")  # stale, from an earlier pool
    pool = threading.Thread(target=lambda: seen.setdefault("result", R._pool(specs, 2, print)))
    pool.start()
    for _ in range(500):  # b has started: its stale file is gone
        if not (tmp_path / "b" / R.THREADS_FILE).exists():
            break
        threading.Event().wait(0.01)
    release["a"].set()  # a ends while b runs and c is still to start: nothing is shared yet
    for _ in range(500):  # c has started (nothing made its folder)
        if not pool.is_alive() or len(seen) >= 1:
            break
        threading.Event().wait(0.01)
    threading.Event().wait(0.2)
    assert not (tmp_path / "c").exists()
    release["b"].set()  # b ends, nothing left to start: c alone may use both cores
    for _ in range(500):
        if (tmp_path / "c" / R.THREADS_FILE).is_file():
            break
        threading.Event().wait(0.01)
    release["c"].set()
    pool.join(10)
    assert seen["a"] is None and seen["b"] is None and seen["c"] == "2"
    assert [r["name"] for r in seen["result"]] == ["a", "b", "c"]


def test_thread_share_hook_sets_the_training_thread_count(tmp_path):
    from types import SimpleNamespace

    from winpos.d2.engine import ThreadShareHook

    before = torch.get_num_threads()
    hook = ThreadShareHook(str(tmp_path / R.THREADS_FILE), every=10)
    hook.trainer = SimpleNamespace(iter=10)
    try:
        hook.after_step()  # no file: unchanged
        assert torch.get_num_threads() == before
        (tmp_path / R.THREADS_FILE).write_text("not a number")
        hook.after_step()
        assert torch.get_num_threads() == before
        want = 1 if before != 1 else 2
        (tmp_path / R.THREADS_FILE).write_text(str(want))
        hook.trainer.iter = 11  # not a check iteration
        hook.after_step()
        assert torch.get_num_threads() == before
        hook.after_train()
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)

"""The main job on the embedded default: the short form of ``winpos.d2.reproduce`` (README command 1).

It starts from the stage-1 checkpoint shipped with winpos (a HieraDet Mask R-CNN pretrained at 64 px with an
absolute embedding that started window-periodic, under 4x4-token window attention; made by ``tools/reproduce.py``,
its command, seed and SHA-256 recorded in the manifest next to it), checks the file against that hash, and
finetunes it at 2x the token grid (the 64 px images upscaled to 128 px) twice: (a') with the embedding naively
interpolated and (b') converted exactly to abs-win on import. Then a four-class finetune of (b'). Each finetune is a one-thread
subprocess, two at a time (the last one takes both cores once the other ends); re-running skips finished runs and resumes the others. It prints the comparison
table, the window similarity of the shipped embedding, and where the plots are.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from winpos.errors import WinposError

DEMO_ROWS = ("abs_periodic", "abs_periodic2win")
CONDITION = "upscaled"  # objects grow with the grid: 20-84 px objects at 128 px, precise enough for a high AP


def check_stage1(checkpoint: str, manifest: str) -> dict:
    """The shipped stage-1 checkpoint, verified against its manifest's SHA-256; returns the manifest."""
    ckpt, man = Path(checkpoint), Path(manifest)
    if not ckpt.is_file():
        raise WinposError(f"stage-1 checkpoint {ckpt} is missing; restore it from the repository (git checkout -- "
                          f"{ckpt.name}) or make one with the command in {man.name}")
    if not man.is_file():
        raise WinposError(f"manifest {man} is missing; restore it from the repository")
    try:
        info = json.loads(man.read_text())
        expected = info["sha256"]
    except (json.JSONDecodeError, KeyError) as e:
        raise WinposError(f"manifest {man} is not valid (no sha256 entry: {e}); restore it from the repository") from None
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    if digest != expected:
        raise WinposError(f"stage-1 checkpoint {ckpt} is corrupt or was replaced: SHA-256 {digest[:12]}... differs "
                          f"from the manifest's {expected[:12]}...; restore it from the repository")
    return info


def run_demo(config: str, checkpoint: str, manifest: str, output_dir="output/demo", iters: int = 400,
             seeds=(0,), workers: int = 2, four_class: bool = True, lr: float = 2e-4, log=print) -> dict:
    """Finetune the shipped stage-1 checkpoint as rows (a') and (b') at 2x grid on upscaled images (and (b') on
    the four-class labels); returns the summary (also ``<output_dir>/summary.json``)."""
    from winpos.d2 import reproduce as R
    from winpos.d2.reproduce_checkpoints import convert_abs_to_abswin, window_structure
    from winpos.outputs import atomic_write

    if not isinstance(iters, int) or iters < 1:
        raise WinposError(f"--iters {iters!r} must be a positive number of finetuning iterations, e.g. 400")
    if not isinstance(lr, (int, float)) or not 0 < lr < 1:
        raise WinposError(f"--lr {lr!r} must be a learning rate in (0, 1), e.g. 2e-4")
    if not isinstance(workers, int) or workers < 1:
        raise WinposError(f"--workers {workers!r} must be a positive int")
    info = check_stage1(checkpoint, manifest)
    from winpos.outputs import check_output_dir

    out = check_output_dir(output_dir, input_files=[checkpoint, manifest])  # resumes: existing runs are kept
    proto = R.Protocol(config=config, output_dir=str(out), rows=DEMO_ROWS, multipliers=(2,), conditions=(CONDITION,),
                       seeds=tuple(seeds), finetune_iters=iters, finetune_lr=float(lr), workers=workers)
    proto.validate()
    (out / "stage2").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    conv = out / "stage2" / "abs_periodic2win_init.pth"
    if not conv.is_file():
        convert_abs_to_abswin(checkpoint, str(conv))
    specs = []
    for seed in seeds:
        for row in DEMO_ROWS:
            spec = R.stage2_spec(proto, row, 2, CONDITION, seed)
            if not R.ROWS[row].convert:
                spec["init"] = str(checkpoint)
            specs.append(spec)
    if four_class:
        spec = R.stage2_spec(proto, "abs_periodic2win", 2, CONDITION, seeds[0])
        spec.update(name=f"abs_periodic2win/{CONDITION}/2x/four-class/seed{seeds[0]}", four_class=True,
                    out=str(out / "stage2" / "four_class" / f"seed{seeds[0]}"))
        specs.append(spec)
    log(f"finetuning the shipped 64 px checkpoint at 128 px: {len(specs)} runs of {iters} iterations, "
        f"{workers} at a time")
    runs = R._pool(specs, workers, log)
    one_class = [r for r in runs if not r["spec"].get("four_class")]
    from winpos.d2.reproduce_report import format_table, plot_results, summarize

    summary = summarize(proto, {"abs_periodic": {"checkpoint": str(checkpoint),
                                          "window_structure": window_structure(str(checkpoint)),
                                          "box_AP_64px": info.get("box_AP_64px"),
                                          "mask_AP_64px": info.get("mask_AP_64px")}}, one_class)
    summary["four_class"] = next(({"bbox": r["bbox"], "segm": r["segm"]} for r in runs
                                  if r["spec"].get("four_class")), None)
    summary["minutes"] = (time.time() - t0) / 60
    summary["stage1_manifest"] = info
    atomic_write(str(out / "summary.json"), lambda f: json.dump(summary, f, indent=1), "w")
    plot_results(summary, str(out / "results.png"))
    return summary


def print_summary(summary: dict, output_dir) -> None:
    from winpos.d2.reproduce_report import format_table

    ws = summary["stage1"]["abs_periodic"]["window_structure"]
    print(f"\n=== winpos demo: a 64 px-pretrained HieraDet Mask R-CNN finetuned at 2x its token grid "
          f"(64 px images upscaled to 128 px, one class, {summary['protocol']['finetune_iters']} iterations) ===")
    man = summary.get("stage1_manifest", {})
    if man.get("box_AP_64px") is not None:
        print(f"shipped stage-1 detector ({man.get('iterations_total', man.get('iterations'))} iterations at 64 px): box AP {man['box_AP_64px']:.1f}, "
              f"mask AP {man['mask_AP_64px']:.1f} at 64 px")
    print(f"shipped stage-1 embedding: window similarity WS@4 = {ws['ws']:.2f} at 16x16 tokens; naive interpolation "
          f"to 32x32 leaves {ws['ws_naive_2x']:.2f}, abs-win keeps {ws['ws_abswin_2x']:.2f}")
    print(format_table(summary))
    fc = summary.get("four_class")
    if fc:
        print(f"four classes (circle/square/triangle/star), row (b): box AP {fc['bbox']['AP']:.1f}, "
              f"mask AP {fc['segm']['AP']:.1f}")
    print(f"\nplot: {output_dir}/results.png; every number: {output_dir}/summary.json "
          f"({summary['minutes']:.1f} min)")

"""The reproduction end to end (``tools/reproduce.py``): stage 0, stage 1 per encoding, the conversions, the
zero-shot evaluations and the finetuning runs of ``winpos.experiments.protocol``, then the summary.

The output folder belongs to one protocol: ``protocol.json`` holds what defines it (config, budgets, learning
rates, stage-1 seed, threads); a re-run of the same protocol continues in it (finished runs are reused, each
checked by its own identity), a different protocol is refused in one line. Rows, multipliers, conditions and
seeds may grow between runs of one folder (more runs, same definitions).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments import runs as R
from winpos.experiments.protocol import (ENCODINGS, ROWS, STAGE0_TRUNK, Protocol, converted_init, no_embedding_spec,
                                         stage0_spec, stage1_spec, stage2_spec, zero_shot_spec)

# what defines a protocol's folder (the lists may grow within one folder)
DEFINING = ("config", "stage0_iters", "stage0_mask_ratio", "pretrain_iters", "finetune_iters", "pretrain_lr",
            "finetune_lr", "stage1_seed", "threads", "stage1_dir")


def claim_folder(p: Protocol) -> Path:
    """Create or accept ``p.output_dir`` for this protocol (see the module docstring)."""
    return claim_settings_folder(p.output_dir, {k: getattr(p, k) for k in DEFINING}, "protocol.json",
                                 "a reproduction")


def claim_settings_folder(output_dir, settings: dict, record: str, what: str) -> Path:
    """Create ``output_dir`` with ``record`` (a json of ``settings``), or accept it when its record holds the same
    settings; refuse a file, a folder of other settings (naming up to three) and a non-empty folder without it."""
    from winpos.utils.outputs import atomic_write_json, check_output_dir

    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise WinposError(f"--output {out} is a file; pass a folder")
    path = out / record
    if path.is_file():
        held = json.loads(path.read_text())
        diff = [f"{k} {settings[k]!r} here, {held.get(k)!r} there" for k in settings if held.get(k) != settings[k]]
        if diff:
            raise WinposError(f"{out} holds {what} made with other settings ({'; '.join(diff[:3])}); pass "
                              "another --output")
        return out
    if out.is_dir() and any(out.iterdir()):
        raise WinposError(f"{out} is not empty and holds no {record}; pass a new or empty --output")
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, settings)
    return out


def load_summary(output_dir, flag: str) -> dict:
    """A study's ``summary.json`` in ``output_dir``, or one line saying how to make it (``flag``: its option)."""
    path = Path(output_dir) / "summary.json"
    if not path.is_file():
        raise WinposError(f"{path} does not exist; run `winpos-reproduce {flag} --output {output_dir}` first")
    return json.loads(path.read_text())


def stage1_info(p: Protocol, strict: bool = True) -> dict:
    from winpos.experiments.checkpoints import window_structure

    info = {}
    for e in p.encodings:
        spec = stage1_spec(p, e)
        final = Path(spec["out"]) / "model_final.pth"
        if not final.is_file():
            if strict:
                raise WinposError(f"stage-1 checkpoint {final} is missing; run without --report-only first")
            info[e] = None
            continue
        res = R.finished(spec)
        entry = {"checkpoint": str(final), "window_structure": window_structure(str(final)),
                 "box_AP_64px": res["bbox"]["AP"] if res else None, "mask_AP_64px": res["segm"]["AP"] if res else None}
        ablated = R.finished(no_embedding_spec(p, e)) if entry["window_structure"] is not None else None
        if ablated:
            entry["box_AP_64px_no_embedding"] = ablated["bbox"]["AP"]
            entry["mask_AP_64px_no_embedding"] = ablated["segm"]["AP"]
        info[e] = entry
    return info


def stage2_specs(p: Protocol) -> tuple[list, list]:
    zero = [zero_shot_spec(p, r, k, c) for k in p.multipliers for c in p.conditions for r in p.rows] \
        if p.zero_shot else []
    fine = [stage2_spec(p, r, k, c, s) for k in p.multipliers for c in p.conditions for s in p.seeds
            for r in p.rows] if p.finetune else []
    return zero, fine


def run_protocol(p: Protocol, log=print, report_only: bool = False, after_stage1=None) -> dict:
    """Run what has not finished (nothing with ``report_only``) and return the summary (also
    ``<output>/results.json``). ``after_stage1()`` is called once every stage-1 checkpoint exists."""
    p.validate()
    if report_only:
        if not (Path(p.output_dir) / "protocol.json").is_file():
            raise WinposError(f"{p.output_dir} holds no reproduction (no protocol.json); run without --report-only "
                              "first, or pass the --output of one")
        claim_folder(p)  # refuses a folder made with other settings
        return _summary(p, log, strict=False)
    out = claim_folder(p)
    t0 = time.time()
    if STAGE0_TRUNK & set(p.encodings):
        log(f"stage 0: unit-layout autoencoder pretraining of the backbone, {p.stage0_iters} iterations at batch 32")
        R.run_pool([stage0_spec(p)], 1, log)
    log(f"stage 1: {', '.join(p.encodings)} at 64 px, {p.pretrain_iters} iterations each")
    R.run_pool([stage1_spec(p, e) for e in p.encodings], p.workers, log)
    if after_stage1 is not None:
        after_stage1()
    from winpos.experiments.checkpoints import convert

    for row in p.rows:
        if ROWS[row].convert:
            dst = converted_init(p, row)
            if not Path(dst).is_file():
                convert(str(Path(stage1_spec(p, ROWS[row].pretrained)["out"]) / "model_final.pth"), dst,
                        ROWS[row].convert)
    zero, fine = stage2_specs(p)
    if p.zero_shot:
        diag = [no_embedding_spec(p, e) for e in p.encodings if ENCODINGS[e]["pos_embed"] != "none"]
        log(f"zero-shot: {len(diag)} stage-1 detectors without their embedding, {len(zero)} stage-2 starts at "
            "their new size")
        R.run_pool(diag + zero, p.workers, log)
    if fine:
        log(f"stage 2: {len(fine)} finetuning runs ({len(p.rows)} rows x {len(p.conditions)} conditions x "
            f"{len(p.multipliers)} multipliers x {len(p.seeds)} seeds), {p.finetune_iters} iterations each")
        R.run_pool(fine, p.workers, log)
    summary = _summary(p, log, strict=True)
    summary["minutes"] = (time.time() - t0) / 60
    from winpos.utils.outputs import atomic_write_json

    atomic_write_json(out / "results.json", summary)
    return summary


def _summary(p: Protocol, log, strict: bool) -> dict:
    from dataclasses import asdict

    from winpos.experiments.report import summarize

    zero, fine = stage2_specs(p)
    results, missing = [], []
    for spec in zero + fine:
        res = R.finished(spec)
        (results.append(res) if res else missing.append(spec["name"]))
    if not results and not strict:
        raise WinposError(f"no finished stage-2 run under {p.output_dir}; run without --report-only first")
    stage0 = R.finished(stage0_spec(p)) if STAGE0_TRUNK & set(p.encodings) else None
    summary = summarize(asdict(p), stage0, stage1_info(p, strict=strict), results)
    summary["missing"] = missing
    if missing:
        log(f"{len(missing)} of the protocol's {len(zero) + len(fine)} stage-2 runs have not finished")
    return summary


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.experiments.reproduce is a library module, not a command; run winpos-reproduce "
          "(--help says how)", file=__import__("sys").stderr)
    raise SystemExit(2)

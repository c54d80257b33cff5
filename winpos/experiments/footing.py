"""The equal-footing study (``tools/reproduce.py --equal-footing``): every position encoding pretrained with
itself, every claim replicated over independently trained detectors.

A **pipeline** is one trained detector per encoding, made from nothing but its pipeline seed ``100 + p``:

* **stage 0**: the backbone with its own encoding (``abs``: a learned absolute embedding; ``relpos``: the same plus
  decomposed relative position bias in every block, ViTDet's original; ``rope``: axial RoPE in every block, no
  token embedding; ``lookhere``: LookHere's direction masks and distance penalties in every block, no token
  embedding), trained with the unit-layout autoencoder of ``winpos.experiments.pretrain`` (mask ratio 0, nothing
  masked), the same objective, budget, data and seed for every encoding;
* **stage 1**: a HieraDet Mask R-CNN at 64 px from that trunk, seed ``100 + p`` (head init, data order, proposal
  sampling), evaluated at 64 px;
* **zero-shot**: the stage-1 detector evaluated without finetuning at larger grids (``ZERO_SHOT``); for ``abs``
  both as trained (naive interpolation) and converted exactly to abs-win on import;
* **finetuning** (``abs`` only, the Bolya claim): naive, abs-win and the zero-window control finetuned at
  ``FINETUNE_CELLS`` for ``finetune_seeds`` seeds each.

The unit of replication is the pipeline: the encodings of one pipeline share its seed (the same random streams),
so they are compared paired by pipeline; different pipelines share nothing but the data sets and the code. The
tests declared before the runs (``docs/equal_footing.md``) are in ``TESTS``; ``analyze`` computes them.

Two declared follow-ups are views of one ``Footing`` (the same specs, runner and collection, other settings):
``replication_study`` (R5 / R6: T5 / T6 again on pipelines 6-11) and ``equivalence_study`` (D1 / D2: abs-win -
naive at canvas 1.25x over 24 new pipelines with stage 1 at 2000 iterations, four finetuning seeds drawn from each
pipeline's seed and an evaluation set of 1000 images of each pipeline's own, tested for a difference and for
equivalence within +-0.25 box AP; ``footing_analysis.analyze_equivalence``).

This module defines the study and the spec of every run; ``footing_runs`` starts, archives, tidies and collects
them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from winpos.errors import WinposError
from winpos.experiments.protocol import (PRETRAIN_SHAPES, PRETRAIN_SIZE, check_multiplier, dataset_params, label)

# encoding name in this study -> key of winpos.experiments.protocol.ENCODINGS
STUDY_ENCODINGS = {"rope": "rope", "relpos": "relpos", "lookhere": "lookhere", "abs": "abs_learned"}
ZERO_SHOT = (("canvas", 2), ("canvas", 4), ("upscaled", 2))  # (condition, grid multiplier)
# canvas 4x: T3 / T4 as declared; canvas 1.25x: the demo's cell, T5 / T6 (added by a dated amendment before its runs)
FINETUNE_CELLS = (("canvas", 4), ("canvas", 1.25))
FINETUNE_ROWS = {"naive": None, "abs2win": "abswin", "control": "control"}  # row -> conversion of the abs detector
REPLICATION_PIPELINES = (6, 7, 8, 9, 10, 11)  # R5 / R6 (docs/equal_footing.md, fifth session)
REPLICATION_CELL = ("canvas", 1.25)
SEED_BASE = 100  # pipeline p uses seed SEED_BASE + p in stage 0 and stage 1
# the declared equivalence study (docs/equal_footing.md, "The equivalence study"): 24 new pipelines, seeds 112-135
EQUIVALENCE_PIPELINES = tuple(range(12, 36))
EQUIVALENCE_CELL = ("canvas", 1.25)
EQUIVALENCE_EVAL_IMAGES = 1000


@dataclass
class Footing:
    """One equal-footing study: its folder, pipelines and budgets."""

    config: str
    output_dir: str = "output/equal_footing"
    pipelines: tuple = (0, 1, 2, 3, 4, 5)
    encodings: tuple = tuple(STUDY_ENCODINGS)
    stage0_iters: int = 400
    stage1_iters: int = 600
    stage1_lr: float = 1e-3
    finetune: bool = False
    finetune_iters: int = 150
    finetune_lr: float = 2e-4
    finetune_seeds: tuple = (0, 1, 2)
    finetune_cells: tuple = FINETUNE_CELLS  # a subset of FINETUNE_CELLS, e.g. only the demo's cell (replication)
    finetune_rows: tuple = tuple(FINETUNE_ROWS)  # a subset: the equivalence study finetunes naive and abs2win only
    zero_shot_cells: tuple = ZERO_SHOT  # the zero-shot evaluations of every chain
    # what the declared tests need whole: fewer pipelines or other finetuning seeds give an interim report
    declared_pipelines: tuple = (0, 1, 2, 3, 4, 5)
    declared_seeds: tuple = (0, 1, 2)
    # finetuning seed j of pipeline p is drawn from p's seed (``finetune_seed``) instead of being j itself
    drawn_seeds: bool = False
    # an evaluation set of this many images of each pipeline's own (drawn from its seed; the shared training
    # images) at every stage-2 cell, evaluated on its two halves too (the evaluation noise); None: the shared set
    eval_images: int | None = None
    pipeline_by_pipeline: bool = False  # run pipeline p's finetuning runs before pipeline p + 1's chain
    # False: once every run of a pipeline is archived, its run folders and its own evaluation set are removed
    # (the report reads the archive; a run asked for again is made again from its seed)
    keep_run_folders: bool = True
    # the declared replication of T5 / T6 (R5 / R6): its pipelines' abs chains and canvas-1.25x runs, reported
    # beside the study when any of them has finished (run them with --pipelines 6,...,11 --encodings abs
    # --finetune-cells canvas:1.25)
    replication_pipelines: tuple = REPLICATION_PIPELINES
    threads: int = 1
    workers: int = 2
    archive_dir: str | None = None  # sealed per-run results kept across sessions (winpos.experiments.archive)

    def validate(self) -> None:
        import os

        bad = [e for e in self.encodings if e not in STUDY_ENCODINGS]
        if bad or not self.encodings:
            raise WinposError(f"unknown encoding(s) {bad}; choose from {', '.join(STUDY_ENCODINGS)}")
        for name in ("pipelines", "finetune_seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values):
                raise WinposError(f"{name} {list(values)} must be a non-empty list without repeats (a repeated "
                                  "seed is not another independent run)")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
                raise WinposError(f"{name} {list(values)} must hold ints >= 0")
        rp = self.replication_pipelines
        if len(set(rp)) != len(rp) or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in rp):
            raise WinposError(f"replication_pipelines {list(rp)} must hold ints >= 0 without repeats (or be empty)")
        for name in ("stage0_iters", "stage1_iters", "finetune_iters", "threads", "workers"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise WinposError(f"{name}={v!r} must be a positive int")
        if not os.path.isfile(self.config):
            raise WinposError(f"config {self.config!r} does not exist; pass configs/shapes/reproduce_hieradet.py")
        for _, k in tuple(self.zero_shot_cells) + FINETUNE_CELLS:
            check_multiplier(k)
        bad = [r for r in self.finetune_rows if r not in FINETUNE_ROWS]
        if bad or not self.finetune_rows:
            raise WinposError(f"finetune rows {list(self.finetune_rows)} must be a non-empty subset of "
                              f"{', '.join(FINETUNE_ROWS)}")
        if self.eval_images is not None and (isinstance(self.eval_images, bool) or
                                             not isinstance(self.eval_images, int) or self.eval_images < 2):
            raise WinposError(f"eval_images={self.eval_images!r} must be an int >= 2 (it is split in two halves)")
        if not self.keep_run_folders and not self.archive_dir:
            raise WinposError("a study that removes its run folders needs an archive to keep their results; pass "
                              "--archive DIR")
        cells = [tuple(c) for c in self.finetune_cells]
        bad = [c for c in cells if c not in FINETUNE_CELLS]
        if bad or not cells or len(set(cells)) != len(cells):
            known = ", ".join(f"{c}:{k:g}" for c, k in FINETUNE_CELLS)
            raise WinposError(f"finetune cells {cells} must be a non-empty subset of the study's cells without "
                              f"repeats: {known}")

    def root(self, p: int, enc: str) -> Path:
        return Path(self.output_dir) / f"pipeline{p}" / enc


# ------------------------------------------------------------------------------------------------ run specs
def stage0_spec(f: Footing, p: int, enc: str) -> dict:
    return dict(name=f"p{p}/{enc}/stage0", kind="stage0", config=f.config, encoding=STUDY_ENCODINGS[enc],
                iters=f.stage0_iters, mask_ratio=0.0, loss_on="all", seed=SEED_BASE + p, threads=f.threads,
                out=str(f.root(p, enc) / "stage0"))


def stage1_spec(f: Footing, p: int, enc: str) -> dict:
    return dict(name=f"p{p}/{enc}/stage1", kind="detect", config=f.config, encoding=STUDY_ENCODINGS[enc],
                size=PRETRAIN_SIZE, shapes=dict(PRETRAIN_SHAPES), iters=f.stage1_iters, seed=SEED_BASE + p,
                lr=f.stage1_lr, warmup=50, threads=f.threads, out=str(f.root(p, enc) / "stage1"),
                init=str(Path(stage0_spec(f, p, enc)["out"]) / "backbone.pth"))


def converted_init(f: Footing, p: int, convert: str) -> str:
    return str(f.root(p, "abs") / "converted" / f"{convert}_init.pth")


def stage2_shapes(f: Footing, p: int, condition: str, k) -> dict:
    """The shapes data of pipeline ``p``'s stage-2 runs at a cell: the shared set, or with ``f.eval_images`` the
    shared training images and an evaluation set of the pipeline's own, drawn from its seed."""
    shapes = dataset_params(k, condition)
    if f.eval_images:
        shapes.update(val_images=f.eval_images, val_seed=SEED_BASE + p)
    return shapes


def finetune_seed(f: Footing, p: int, j: int) -> int:
    """The training seed of pipeline ``p``'s finetuning run number ``j``: ``j`` itself, or with ``f.drawn_seeds``
    a number drawn from the pipeline's seed (the first 31 bits of SHA-256 of "seed:j"), so no two pipelines share a
    finetuning stream."""
    if not f.drawn_seeds:
        return j
    import hashlib

    return int(hashlib.sha256(f"{SEED_BASE + p}:{j}".encode()).hexdigest()[:8], 16) % 2 ** 31


def _stage2_base(f: Footing, p: int, enc: str, row: str, condition: str, k) -> dict:
    convert = FINETUNE_ROWS.get(row) if enc == "abs" else None
    init = converted_init(f, p, convert) if convert else str(Path(stage1_spec(f, p, enc)["out"]) / "model_final.pth")
    return dict(kind="detect", config=f.config, encoding=STUDY_ENCODINGS[enc], convert=convert,
                size=check_multiplier(k), shapes=stage2_shapes(f, p, condition, k), init=init, threads=f.threads)


def zero_shot_spec(f: Footing, p: int, enc: str, row: str, condition: str, k) -> dict:
    """``row`` is the encoding itself, or for ``abs`` one of ``naive`` / ``abs2win``."""
    base = _stage2_base(f, p, enc, row, condition, k)
    return dict(base, name=f"p{p}/{row}/{condition}/{label(k)}/zero-shot", iters=0, seed=0, lr=f.finetune_lr,
                warmup=20, out=str(f.root(p, enc) / "zero_shot" / row / condition / label(k)))


def finetune_spec(f: Footing, p: int, row: str, condition: str, k, seed: int) -> dict:
    base = _stage2_base(f, p, "abs", row, condition, k)
    return dict(base, name=f"p{p}/{row}/{condition}/{label(k)}/seed{seed}", iters=f.finetune_iters,
                seed=finetune_seed(f, p, seed),
                lr=f.finetune_lr, warmup=20, keep_weights=False,
                out=str(f.root(p, "abs") / "finetune" / row / condition / label(k) / f"seed{seed}"))


def zero_shot_rows(enc: str) -> tuple:
    # the control equals naive before finetuning (its window part starts at zero): not evaluated zero-shot
    return ("naive", "abs2win") if enc == "abs" else (enc,)


def chain_specs(f: Footing, p: int, enc: str) -> list[dict]:
    """The runs of one (pipeline, encoding), in order: stage 0, stage 1, the zero-shot evaluations."""
    zero = [zero_shot_spec(f, p, enc, row, c, k) for c, k in f.zero_shot_cells for row in zero_shot_rows(enc)]
    return [stage0_spec(f, p, enc), stage1_spec(f, p, enc)] + zero


def no_embedding_spec(f: Footing, p: int) -> dict:
    """Diagnosis, not a declared test: pipeline ``p``'s abs detector at 64 px with its token embedding set to zero
    (how much the detector relies on the embedding at all); its result also records the embedding's window
    structure (WS@4 at 64 px, and after naive and abs-win resizing)."""
    s1 = stage1_spec(f, p, "abs")
    return dict(s1, name=f"p{p}/abs/no-embedding", iters=0, zero_embedding=True,
                init=str(Path(s1["out"]) / "model_final.pth"), out=str(f.root(p, "abs") / "diagnosis" / "no_embedding"))


def diagnosis_specs(f: Footing, p: int) -> list[dict]:
    return [no_embedding_spec(f, p)] if "abs" in f.encodings else []


def finetune_specs(f: Footing, p: int, cells=None) -> list[dict]:
    """Pipeline ``p``'s finetuning runs at ``cells`` (default: the study's ``finetune_cells``), cell by cell."""
    if not f.finetune or "abs" not in f.encodings:
        return []
    cells = f.finetune_cells if cells is None else cells
    return [finetune_spec(f, p, row, c, k, s) for c, k in cells for s in f.finetune_seeds for row in FINETUNE_ROWS
            if row in f.finetune_rows]


def mae_spec(f: Footing, iters: int) -> dict:
    """The masked stage-0 variant ``hiera_mae`` (half the units masked, loss on the masked units only, masked tokens
    kept in the encoder, a linear decoder; not Hiera's MAE), absolute embedding, pipeline 0's seed, ``iters``
    iterations: does a longer schedule grow the window pattern?"""
    return dict(name=f"stage0_hiera_mae_{iters}", kind="stage0", config=f.config, encoding="abs_learned",
                iters=iters, mask_ratio=0.5, loss_on="masked", seed=SEED_BASE, threads=f.threads,
                out=str(Path(f.output_dir) / "variants" / f"hiera_mae_{iters}"))


def pipeline_specs(f: Footing, p: int) -> list[dict]:
    """Every run of pipeline ``p``: its chains, diagnosis and finetuning runs."""
    return [s for enc in f.encodings for s in chain_specs(f, p, enc)] + diagnosis_specs(f, p) + finetune_specs(f, p)


def all_specs(f: Footing, mae_iters: int | None = None) -> list[dict]:
    """Every run of the study, in the order ``run`` starts them (the masked stage-0 variant first when asked for)."""
    specs = [mae_spec(f, mae_iters)] if mae_iters else []
    for p in f.pipelines:
        specs += [s for enc in f.encodings for s in chain_specs(f, p, enc)] + diagnosis_specs(f, p)
    for cell in f.finetune_cells:
        for p in f.pipelines:
            specs += finetune_specs(f, p, (cell,))
    return specs


# ---------------------------------------------------------------------------------------- declared follow-ups
def replication_study(f: Footing) -> Footing | None:
    """The declared replication of ``f``: its replication pipelines not already among ``f``'s, ``abs`` only, the
    canvas-1.25x finetuning runs (None when there is none)."""
    from dataclasses import replace

    pipes = tuple(p for p in f.replication_pipelines if p not in f.pipelines)
    if not pipes or "abs" not in f.encodings or not f.finetune:
        return None
    return replace(f, pipelines=pipes, declared_pipelines=pipes, encodings=("abs",),
                   finetune_cells=(REPLICATION_CELL,), replication_pipelines=())


def equivalence_study(f: Footing) -> Footing:
    """The declared equivalence study (docs/equal_footing.md, "The equivalence study") with ``f``'s config, output,
    archive, workers and threads: ``abs`` only, pipelines 12-35, stage 0 400 iterations, stage 1 2000, zero-shot
    and finetuning (naive, abs2win; 150 iterations, four seeds drawn from the pipeline's seed) at canvas 1.25x, each
    pipeline evaluated on 1000 images of its own; pipeline by pipeline, its run folders removed once archived."""
    from dataclasses import replace

    return replace(f, pipelines=EQUIVALENCE_PIPELINES, declared_pipelines=EQUIVALENCE_PIPELINES, encodings=("abs",),
                   stage0_iters=400, stage1_iters=2000, stage1_lr=1e-3, finetune=True, finetune_iters=150,
                   finetune_lr=2e-4, finetune_seeds=(0, 1, 2, 3), declared_seeds=(0, 1, 2, 3), drawn_seeds=True,
                   finetune_cells=(EQUIVALENCE_CELL,), finetune_rows=("naive", "abs2win"),
                   zero_shot_cells=(EQUIVALENCE_CELL,), eval_images=EQUIVALENCE_EVAL_IMAGES, replication_pipelines=(),
                   pipeline_by_pipeline=True, keep_run_folders=False)


# the tests and the analysis live in footing_analysis; named here too, as the study's one entry point
from winpos.experiments.footing_analysis import (ALPHA, DECLARED_FAMILY, T1_MARGIN, TESTS,  # noqa: E402,F401
                                                 analyze, declared_tests, diagnosis)


if __name__ == "__main__":  # a library module: name the command instead of exiting 0 having done nothing
    print("error: winpos.experiments.footing is a library module, not a command; run winpos-reproduce "
          "(--help says how)", file=__import__("sys").stderr)
    raise SystemExit(2)

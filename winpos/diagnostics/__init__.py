"""Window-similarity diagnostics: does every attention window see the same position embedding?

``effective_embeddings`` finds the embedding in a checkpoint, ``analyze`` measures it at several image sizes
(native, naively interpolated, abs-win), ``winpos.diagnostics.plots`` draws it, and ``run_posemb_viz`` does all
three for the ``winpos-posemb`` command (winpos.cli.posemb_viz). The doctor (``winpos.diagnostics.doctor``) checks a
built model at an image size: its token embedding, and with ``position_terms`` (``winpos.diagnostics.terms``) what
its RoPE and relpos terms see against their training, drawn by ``winpos.diagnostics.term_plots``. Plotting
(matplotlib) is imported only when used.

Modules:

    extract       the position embedding in another project's checkpoint, as the grid the model adds
    metrics       window-similarity metrics on an effective embedding grid
    report        numbers and verdicts at several image sizes, and the ``winpos-posemb plot`` driver
    plots         the window-similarity figures (Agg canvases)
    doctor        the doctor: what each position term of a built model sees at an image size
    terms         the doctor's reading of the RoPE and relpos block terms at a new image size
    term_plots    figures of the doctor's block-term reading, one per term
"""

from winpos.diagnostics.extract import FORMATS, EmbeddingInfo, effective_embeddings
from winpos.diagnostics.metrics import (PeriodScan, abswin_embed, abswin_parts_from_grid, naive_resize,
                                        offset_similarity_map, period_scan, periodic_energy_ratio,
                                        window_similarity, window_similarity_matrix)
from winpos.diagnostics.report import analyze, run_posemb_viz, verdict
from winpos.diagnostics.terms import TermReport, position_terms

__all__ = [
    "FORMATS", "EmbeddingInfo", "effective_embeddings", "PeriodScan", "abswin_embed", "abswin_parts_from_grid",
    "naive_resize", "offset_similarity_map", "period_scan", "periodic_energy_ratio", "window_similarity",
    "window_similarity_matrix", "analyze", "run_posemb_viz", "verdict", "TermReport", "position_terms",
]

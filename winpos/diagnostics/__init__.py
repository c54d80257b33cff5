"""Window-similarity diagnostics: does every attention window see the same position embedding?

``effective_embeddings`` finds the embedding in a checkpoint, ``analyze`` measures it at several image sizes
(native, naively interpolated, abs-win), ``winpos.diagnostics.plots`` draws it, and ``run_posemb_viz`` does all
three for the ``winpos-posemb`` command (winpos.cli.posemb_viz). Plotting (matplotlib) is imported only when used.
"""

from winpos.diagnostics.extract import FORMATS, EmbeddingInfo, effective_embeddings
from winpos.diagnostics.metrics import (PeriodScan, abswin_embed, abswin_parts_from_grid, naive_resize,
                                        offset_similarity_map, period_scan, periodic_energy_ratio,
                                        window_similarity, window_similarity_matrix)
from winpos.diagnostics.report import analyze, run_posemb_viz, verdict

__all__ = [
    "FORMATS", "EmbeddingInfo", "effective_embeddings", "PeriodScan", "abswin_embed", "abswin_parts_from_grid",
    "naive_resize", "offset_similarity_map", "period_scan", "periodic_energy_ratio", "window_similarity",
    "window_similarity_matrix", "analyze", "run_posemb_viz", "verdict",
]

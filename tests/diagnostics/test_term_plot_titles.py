"""Block lists in the doctor's figure titles fold runs, so a title of SAM3's 28 window blocks fits its panel."""
from winpos.diagnostics.term_plots import _block_ranges


def test_block_runs_are_folded():
    sam3_windows = [i for i in range(32) if i not in (7, 15, 23, 31)]
    assert _block_ranges(sam3_windows) == "0-6, 8-14, 16-22, 24-30"
    assert _block_ranges((7, 15, 23, 31)) == "7, 15, 23, 31"
    assert _block_ranges([3, 1, 2, 9, 10]) == "1-3, 9, 10"
    assert _block_ranges([]) == ""

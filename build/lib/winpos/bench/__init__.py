"""Benchmark harness: winpos and its peers timed interleaved in one process, reported as ratios."""

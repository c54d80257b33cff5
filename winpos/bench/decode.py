"""Image decoding, PIL against OpenCV, side by side in one process (``winpos-bench-decode`` or
``python -m winpos.bench.decode``).

    winpos-bench-decode [--jpegs 100] [--pngs 20] [--rounds 3] [--threads 1] [--json OUT] [--force]

Encodes the sets in memory first (no disk in the timing): JPEGs of 1024x768 (quality 90, EXIF orientation 6 on every
other one), 16-bit grey PNGs and 48-bit colour PNGs of 512x384, all smooth shapes on a gradient with mild noise.
Then, per round, each method decodes the whole set, methods interleaved; the report is the median ms per image over
the rounds and the ratio PIL / OpenCV. Methods: ``PIL`` (``winpos.data.images.decode_with_pil``, the path before
OpenCV), ``winpos`` (``read_rgb``'s decoder: OpenCV, the same uint8 RGB array) and ``cv2 native`` (OpenCV's own
array: BGR, 16 bits kept). The report says whether PIL and winpos give equal arrays (a 48-bit PNG cannot: PIL keeps
only its high bytes). Bad input: one "error:" line, exit status 2.
"""
from __future__ import annotations

import io
import statistics
import sys
import time

import numpy as np

from winpos.utils.cli import ArgumentParser, positive_int, run_cli

__all__ = ["make_sets", "measure", "table", "main"]


def _scene(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth ``(H, W, 3)`` float image in 0..1: a gradient, a few flat rectangles and discs, mild noise."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([xx / w, yy / h, 0.5 + 0.5 * np.sin(xx / 37 + yy / 53)], -1)
    for _ in range(12):
        cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(h // 20, h // 5)
        shape = (yy - cy) ** 2 + (xx - cx) ** 2 < r * r if rng.random() < 0.5 else \
            (abs(yy - cy) < r) & (abs(xx - cx) < r * 1.5)
        img[shape] = rng.random(3)
    return np.clip(img + 0.02 * rng.standard_normal(img.shape, dtype=np.float32), 0, 1)


def make_sets(jpegs: int, pngs: int, seed: int = 0) -> dict[str, list[bytes]]:
    """``{set name: [encoded bytes]}`` (see the module docstring)."""
    import cv2
    from PIL import Image

    rng = np.random.default_rng(seed)
    sets = {"JPEG 1024x768 q90": [], "16-bit grey PNG 512x384": [], "48-bit colour PNG 512x384": []}
    for i in range(jpegs):
        image = Image.fromarray((_scene(rng, 768, 1024) * 255).round().astype(np.uint8))
        exif = image.getexif()
        if i % 2:
            exif[0x0112] = 6
        buf = io.BytesIO()
        image.save(buf, format="JPEG", quality=90, exif=exif.tobytes())  # output-policy: into memory, no file
        sets["JPEG 1024x768 q90"].append(buf.getvalue())
    for _ in range(pngs):
        deep = (_scene(rng, 384, 512) * 65535).round().astype(np.uint16)
        sets["16-bit grey PNG 512x384"].append(cv2.imencode(".png", deep[..., 0])[1].tobytes())
        sets["48-bit colour PNG 512x384"].append(cv2.imencode(".png", deep)[1].tobytes())
    return {k: v for k, v in sets.items() if v}


def _methods():
    import cv2

    from winpos.data.images import decode, decode_with_pil, to_uint8

    return {"PIL": decode_with_pil, "winpos": lambda data: to_uint8(decode(data)),
            "cv2 native": lambda data: cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_ANYDEPTH
                                                    | cv2.IMREAD_ANYCOLOR)}


def measure(sets: dict[str, list[bytes]], rounds: int = 3) -> list[dict]:
    """One row per set: median ms per image of each method over ``rounds`` interleaved rounds, the PIL / winpos
    and PIL / cv2-native ratios, and whether PIL and winpos decode to equal arrays."""
    methods = _methods()
    rows = []
    for name, items in sets.items():
        times = {m: [] for m in methods}
        for _ in range(rounds):
            for m, fn in methods.items():
                start = time.perf_counter()
                for data in items:
                    fn(data)
                times[m].append((time.perf_counter() - start) * 1000 / len(items))
        ms = {m: statistics.median(t) for m, t in times.items()}
        same = all(np.array_equal(methods["PIL"](d), methods["winpos"](d)) for d in items)
        rows.append({"set": name, "images": len(items), "ms_per_image": ms, "ratio_pil_over_winpos":
                     ms["PIL"] / ms["winpos"], "ratio_pil_over_cv2_native": ms["PIL"] / ms["cv2 native"],
                     "same_array": same})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| set | images | PIL ms/img | winpos (OpenCV) ms/img | PIL / winpos | cv2 native ms/img | PIL / native "
             "| same array |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ms = r["ms_per_image"]
        lines.append(f"| {r['set']} | {r['images']} | {ms['PIL']:.2f} | {ms['winpos']:.2f} | "
                     f"{r['ratio_pil_over_winpos']:.2f}x | {ms['cv2 native']:.2f} | "
                     f"{r['ratio_pil_over_cv2_native']:.2f}x | {'yes' if r['same_array'] else 'no'} |")
    return "\n".join(lines)


def run(argv=None) -> int:
    import argparse

    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jpegs", type=positive_int, default=100, help="JPEGs in the set (default 100)")
    p.add_argument("--pngs", type=positive_int, default=20, help="PNGs of each 16-bit kind (default 20)")
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved rounds; the median is reported")
    p.add_argument("--threads", type=positive_int, default=1, help="OpenCV threads (default 1, as one loader worker)")
    p.add_argument("--json", default=None, help="also write the rows here (an existing file only with --force)")
    p.add_argument("--force", action="store_true", help="replace an existing --json")
    args = p.parse_args(argv)
    if args.json:
        from winpos.utils.outputs import check_output_file

        check_output_file(args.json, force=args.force, flag="--json", suffixes=(".json",))
    import platform

    import cv2
    import PIL

    cv2.setNumThreads(args.threads)
    rows = measure(make_sets(args.jpegs, args.pngs), args.rounds)
    print(f"PIL {PIL.__version__}, OpenCV {cv2.__version__}, {args.threads} OpenCV thread(s), "
          f"{platform.machine()}, median of {args.rounds} rounds")
    print(table(rows))
    if args.json:
        from winpos.utils.outputs import atomic_write_json

        atomic_write_json(args.json, {"rows": rows, "rounds": args.rounds, "threads": args.threads})
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Reading an image file as the RGB the models see, with its real range, or refusing it in one line.

``read_rgb(path)`` -> ``(H, W, 3) uint8``; ``read_array(path)`` -> ``(H, W, 3)`` at the file's own depth (``uint16``
for a 16-bit PNG or TIFF, colour or grey, every bit kept); both with the EXIF orientation applied (as a viewer shows
the file). The file's header (PIL, no pixels decoded) decides the decoder:

| PIL mode | decoded by | read as |
|---|---|---|
| ``RGB``, ``L`` (8 or 16 bits), ``I;16``, ``I;16L``, ``I;16B``, ``I;16N`` | OpenCV | full depth (read_rgb: v / 257) |
| ``1``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``, ``RGBX`` | PIL | PIL's conversion to RGB |
| ``P`` (palette, with or without transparency) | PIL | its palette colours; transparency as for alpha below |
| ``RGBA``, ``LA``, ``PA``, ``RGBa``, ``La`` | PIL | composited over white at 8 bits, as a viewer shows transparency |
| ``I`` (32-bit integer grey) | PIL | the same 16-bit scaling when every value is in 0..65535; refused otherwise |
| ``F`` (32-bit float), anything else | | refused: the file has no range winpos can know |

PIL reads a 48-bit colour PNG as its high bytes (1000 -> 3, where v / 257 is 4) and its ``convert("RGB")`` clips
16-bit grey at 255, which is why neither decodes those files here. OpenCV decodes JPEGs about 1.3x faster than PIL,
to the same array (``python -m winpos.bench.decode``); ``decode_with_pil`` is the PIL-only path it is measured
against. A file OpenCV cannot decode (a format it was built without) is decoded by PIL.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from winpos.errors import WinposError

__all__ = ["read_rgb", "read_array", "decode", "decode_with_pil", "to_rgb", "to_uint8", "read_image",
           "READABLE_MODES"]

_DIRECT = ("RGB", "L", "1", "CMYK", "YCbCr", "LAB", "HSV", "RGBX")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La", "P")
_SIXTEEN = ("I;16", "I;16L", "I;16B", "I;16N")
READABLE_MODES = _DIRECT + _ALPHA + _SIXTEEN + ("I",)
_OPENCV = ("RGB", "L") + _SIXTEEN  # decoded by OpenCV, at full depth


def _refuse(name: str, mode: str, why: str) -> WinposError:
    return WinposError(f"image {name} has PIL mode {mode!r}: {why}; save it as 8-bit or 16-bit RGB / greyscale "
                       "(PNG or JPEG) and use that file")


def to_rgb(image: Image.Image, name: str = "the image") -> np.ndarray:
    """An open PIL image (orientation already applied) as ``(H, W, 3) uint8`` RGB with its real range."""
    mode = image.mode
    if mode in _SIXTEEN or mode == "I":
        grey = np.asarray(image, dtype=np.int64)
        if grey.size and (grey.min() < 0 or grey.max() > 65535):
            raise _refuse(name, mode, f"its values span {grey.min()}..{grey.max()}, not a 16-bit range")
        grey8 = ((grey * 255 + 32767) // 65535).astype(np.uint8)  # 65535 -> 255, 257 * v -> v
        return np.repeat(grey8[..., None], 3, axis=2)
    if mode in _ALPHA:
        if mode == "P" and "transparency" not in image.info:
            return np.asarray(image.convert("RGB"))
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"))
    if mode in _DIRECT:
        return np.asarray(image.convert("RGB"))
    raise _refuse(name, mode, "winpos cannot tell the range of its values")


def to_uint8(array: np.ndarray) -> np.ndarray:
    """``uint8`` as is; ``uint16`` scaled over the full range (v / 257, rounded: 65535 -> 255, 257 * v -> v)."""
    if array.dtype == np.uint8:
        return array
    return ((array.astype(np.uint32) * 255 + 32767) // 65535).astype(np.uint8)  # exact: no v / 257 is a tie


def decode_with_pil(data: bytes, name: str = "the image") -> np.ndarray:
    """Encoded image ``data`` as ``(H, W, 3) uint8`` RGB decoded by PIL alone (a 48-bit colour PNG loses its low
    bytes): the path before OpenCV, kept as the benchmark's baseline."""
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return to_rgb(ImageOps.exif_transpose(image), name)


def _opencv(data: bytes) -> np.ndarray | None:
    import cv2

    # ANYDEPTH | ANYCOLOR: 16 bits kept, grey stays one channel, the EXIF orientation applied as PIL applies it
    array = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_ANYDEPTH | cv2.IMREAD_ANYCOLOR)
    if array is None or array.dtype not in (np.uint8, np.uint16):
        return None
    if array.ndim == 2:
        return cv2.cvtColor(array, cv2.COLOR_GRAY2RGB)
    return cv2.cvtColor(array, cv2.COLOR_BGR2RGB)  # 20x faster than a numpy flip made contiguous


def decode(data: bytes, name: str = "the image") -> np.ndarray:
    """Encoded image ``data`` as ``(H, W, 3)`` RGB at its own depth (``uint8`` or ``uint16``), EXIF orientation
    applied; see the module docstring for which decoder reads which file. WinposError for an unreadable mode; PIL's
    errors for bytes that are no image."""
    with Image.open(io.BytesIO(data)) as image:  # the header only
        mode = image.mode
        if mode not in _OPENCV:
            image.load()
            return to_rgb(ImageOps.exif_transpose(image), name)
    array = _opencv(data)
    return array if array is not None else decode_with_pil(data, name)


def read_array(path) -> np.ndarray:
    """Read ``path`` as ``(H, W, 3)`` RGB at the file's own depth (``uint16`` for a 16-bit file, every bit kept)."""
    return decode(Path(path).read_bytes(), str(path))


def read_rgb(path) -> np.ndarray:
    """Read ``path`` as ``(H, W, 3) uint8`` RGB (see the module docstring); WinposError for an unreadable mode."""
    return to_uint8(read_array(path))


def read_image(path, format: str = "RGB") -> np.ndarray:
    """``read_rgb`` in a detectron2 ``image_format``: ``"RGB"`` or ``"BGR"`` (channels reversed)."""
    if format not in ("RGB", "BGR"):
        raise WinposError(f"image_format={format!r} is not read by winpos; use 'RGB' or 'BGR'")
    rgb = read_rgb(path)
    return rgb if format == "RGB" else np.ascontiguousarray(rgb[..., ::-1])

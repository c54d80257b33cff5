"""Reading an image file as the 8-bit RGB the models see, with its real range, or refusing it in one line.

``read_rgb(path)`` -> ``(H, W, 3) uint8`` array, EXIF orientation applied (as a viewer shows the file):

| PIL mode | read as |
|---|---|
| ``RGB``, ``L``, ``1``, ``CMYK``, ``YCbCr``, ``LAB``, ``HSV``, ``RGBX`` | PIL's conversion to RGB |
| ``P`` (palette, with or without transparency) | its palette colours; transparency as for alpha below |
| ``RGBA``, ``LA``, ``PA``, ``RGBa``, ``La`` | composited over white, as a viewer shows transparency |
| ``I;16``, ``I;16L``, ``I;16B``, ``I;16N`` (16-bit grey) | scaled to 8 bits over the full 16-bit range (v / 257) |
| ``I`` (32-bit integer grey, e.g. a 16-bit PNG opened by some PIL versions) | the same 16-bit scaling when every value is in 0..65535; refused otherwise |
| ``F`` (32-bit float), anything else | refused: the file has no range winpos can know |

PIL's own ``convert("RGB")`` clips 16-bit values at 255 (a 16-bit image reads as white), which is why nothing
here converts those modes directly.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageOps

from winpos.errors import WinposError

__all__ = ["read_rgb", "to_rgb", "read_image", "READABLE_MODES"]

_DIRECT = ("RGB", "L", "1", "CMYK", "YCbCr", "LAB", "HSV", "RGBX")
_ALPHA = ("RGBA", "LA", "PA", "RGBa", "La", "P")
_SIXTEEN = ("I;16", "I;16L", "I;16B", "I;16N")
READABLE_MODES = _DIRECT + _ALPHA + _SIXTEEN + ("I",)


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


def read_rgb(path) -> np.ndarray:
    """Read ``path`` as ``(H, W, 3) uint8`` RGB (see the module docstring); WinposError for an unreadable mode."""
    with Image.open(path) as image:
        image.load()
        image = ImageOps.exif_transpose(image)
        return to_rgb(image, str(path))


def read_image(path, format: str = "RGB") -> np.ndarray:
    """``read_rgb`` in a detectron2 ``image_format``: ``"RGB"`` or ``"BGR"`` (channels reversed)."""
    if format not in ("RGB", "BGR"):
        raise WinposError(f"image_format={format!r} is not read by winpos; use 'RGB' or 'BGR'")
    rgb = read_rgb(path)
    return rgb if format == "RGB" else np.ascontiguousarray(rgb[..., ::-1])

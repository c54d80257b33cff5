"""winpos.data.images: OpenCV decodes RGB / grey files at full depth (a 16-bit colour PNG without loss), with the
EXIF orientation PIL applies; the arrays equal the PIL-only path (``decode_with_pil``, the oracle) wherever that path
is exact."""
import io

import cv2
import numpy as np
import pytest
from PIL import Image

from winpos.data.images import decode, decode_with_pil, read_array, read_image, read_rgb, to_uint8

RNG = np.random.default_rng(0)


def _png16_rgb(path, array):
    assert cv2.imwrite(str(path), np.ascontiguousarray(array[..., ::-1]))  # OpenCV writes BGR
    return path


def test_16bit_colour_png_is_read_without_loss(tmp_path):
    want = RNG.integers(0, 65536, (7, 11, 3), dtype=np.uint16)
    want[0, 0] = (1000, 65535, 0)
    path = _png16_rgb(tmp_path / "deep.png", want)
    got = read_array(path)
    assert got.dtype == np.uint16 and np.array_equal(got, want)  # before: no 16-bit read at all
    rgb = read_rgb(path)
    assert rgb.dtype == np.uint8 and tuple(rgb[0, 0]) == (4, 255, 0)  # 1000 / 257 = 3.9 -> 4
    assert np.array_equal(rgb, np.round(want / 257).astype(np.uint8))
    pil = decode_with_pil(path.read_bytes())
    assert tuple(pil[0, 0]) == (3, 255, 0)  # PIL keeps the high byte only: what read_rgb gave before


def test_16bit_grey_png_keeps_its_range(tmp_path):
    grey = RNG.integers(0, 65536, (5, 6), dtype=np.uint16)
    path = tmp_path / "grey16.png"
    Image.fromarray(grey).save(path)
    assert Image.open(path).mode == "I;16"
    assert np.array_equal(read_array(path), np.repeat(grey[..., None], 3, axis=2))
    assert np.array_equal(read_rgb(path), decode_with_pil(path.read_bytes()))  # the old path's v / 257


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_every_exif_orientation_as_pil_applies_it(fmt, tmp_path):
    base = RNG.integers(0, 256, (6, 9, 3), dtype=np.uint8)
    for orientation in range(1, 9):
        image = Image.fromarray(base)
        exif = image.getexif()
        exif[0x0112] = orientation
        buf = io.BytesIO()
        image.save(buf, format=fmt, exif=exif.tobytes(), **({"quality": 95} if fmt == "JPEG" else {}))
        data = buf.getvalue()
        got, oracle = decode(data), decode_with_pil(data)
        assert got.shape == oracle.shape and np.array_equal(got, oracle), orientation
        if orientation in (5, 6, 7, 8):
            assert got.shape[:2] == (9, 6)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA", "CMYK", "1"])
def test_other_modes_read_as_before(mode, tmp_path):
    image = Image.fromarray(RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8)).convert(mode)
    if mode == "RGBA":
        image.putalpha(Image.fromarray(RNG.integers(0, 256, (8, 8), dtype=np.uint8)))
    path = tmp_path / ("x.jpg" if mode == "CMYK" else "x.png")
    image.save(path)
    got = read_rgb(path)
    assert got.dtype == np.uint8 and got.shape == (8, 8, 3)
    assert np.array_equal(got, decode_with_pil(path.read_bytes()))


def test_read_image_bgr_and_to_uint8():
    assert np.array_equal(to_uint8(np.array([0, 128, 257, 1000, 65535], np.uint16)), [0, 0, 1, 4, 255])
    x = np.array([7, 8], np.uint8)
    assert to_uint8(x) is x


def test_read_image_formats(tmp_path):
    path = tmp_path / "c.png"
    Image.fromarray(RNG.integers(0, 256, (4, 5, 3), dtype=np.uint8)).save(path)
    rgb = read_image(path, "RGB")
    assert np.array_equal(read_image(path, "BGR"), rgb[..., ::-1])


def test_bytes_that_are_no_image_raise(tmp_path):
    from PIL import UnidentifiedImageError

    with pytest.raises(UnidentifiedImageError):
        decode(b"not an image")

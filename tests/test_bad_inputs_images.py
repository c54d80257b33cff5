"""Images read as they are: each PIL mode the readers accept gives the pixels of an 8-bit copy of the same scene
(16-bit scaled, palette and alpha handled, EXIF orientation applied), in winpos.data.images, the training mapper
and predict.py; any other mode is refused in one line naming the file and the mode."""
import json

import numpy as np
import pytest
from PIL import Image

from tests.bad_inputs_helpers import detector  # noqa: F401 (a fixture)


def _scene():
    """64 x 48 px: a dark background with a red rectangle (two colours, so a palette holds it exactly)."""
    a = np.full((48, 64, 3), 40, np.uint8)
    a[10:30, 20:44] = (220, 60, 60)
    return a


def _grey(a):
    return np.repeat(np.asarray(Image.fromarray(a).convert("L"))[..., None], 3, axis=2)


def _save(tmp_path, name, image, **kw):
    path = tmp_path / name
    image.save(path, **kw)
    return path


def _cases(tmp_path):
    """(file, the 8-bit RGB it must read as, max abs difference allowed)."""
    base = _scene()
    grey8 = np.asarray(Image.fromarray(base).convert("L"))
    alpha = np.full(base.shape[:2], 255, np.uint8)
    alpha[:, :8] = 0  # a transparent band: shown over white
    over_white = base.copy()
    over_white[:, :8] = 255
    rgba = np.dstack([base, alpha])
    stored = np.ascontiguousarray(np.rot90(base, k=1))  # orientation 6 rotates it back (90 degrees clockwise)
    exif_image = Image.fromarray(stored)
    exif = exif_image.getexif()
    exif[0x0112] = 6
    palette = Image.fromarray(base).quantize(colors=2)
    palette_t = palette.copy()
    palette_t.info["transparency"] = int(np.asarray(palette)[0, 0])  # the background colour's index
    bg_white = base.copy()
    bg_white[(base == 40).all(axis=2)] = 255
    return [
        (_save(tmp_path, "rgb.png", Image.fromarray(base)), base, 0),
        (_save(tmp_path, "grey.png", Image.fromarray(grey8)), _grey(base), 0),
        (_save(tmp_path, "grey16.png", Image.fromarray(grey8.astype(np.uint16) * 257)), _grey(base), 0),
        (_save(tmp_path, "palette.png", palette), base, 0),
        (_save(tmp_path, "palette_transparent.png", palette_t, transparency=palette_t.info["transparency"]),
         bg_white, 0),
        (_save(tmp_path, "rgba.png", Image.fromarray(rgba)), over_white, 0),
        (_save(tmp_path, "grey_alpha.png", Image.fromarray(np.dstack([grey8, alpha]), "LA")),
         _grey(over_white), 0),
        (_save(tmp_path, "exif6.png", exif_image, exif=exif.tobytes()), base, 0),
        (_save(tmp_path, "cmyk.jpg", Image.fromarray(base).convert("CMYK"), quality=100), base, 8),
    ]


def test_every_mode_reads_as_its_8bit_copy(tmp_path):
    from winpos.data.images import read_rgb

    cases = _cases(tmp_path)
    modes = {Image.open(p).mode for p, _, _ in cases}
    assert {"RGB", "L", "I;16", "P", "RGBA", "LA", "CMYK"} <= modes, modes
    for path, expected, tol in cases:
        got = read_rgb(path)
        assert got.dtype == np.uint8 and got.shape == expected.shape, (path.name, got.shape)
        assert np.abs(got.astype(int) - expected).max() <= tol, path.name


def test_32bit_integer_images_scale_as_16bit_or_are_refused():
    from winpos.data.images import to_rgb
    from winpos.errors import WinposError

    grey8 = np.asarray(Image.fromarray(_scene()).convert("L"))
    got = to_rgb(Image.fromarray(grey8.astype(np.int32) * 257, "I"))
    assert (got == _grey(_scene())).all()
    with pytest.raises(WinposError, match=r"image x.tif has PIL mode 'I': its values span -5\.\.70000"):
        to_rgb(Image.fromarray(np.array([[-5, 70000]], np.int32), "I"), "x.tif")


def test_float_images_are_refused_naming_file_and_mode(tmp_path):
    from winpos.data.coco import validate_coco_json
    from winpos.data.images import read_rgb
    from winpos.errors import WinposError

    path = _save(tmp_path, "depth.tif", Image.fromarray(np.random.rand(48, 64).astype(np.float32), "F"))
    with pytest.raises(WinposError, match=r"image .*depth.tif has PIL mode 'F'.*save it as 8-bit"):
        read_rgb(path)
    dataset = {"images": [{"id": 1, "file_name": "depth.tif", "width": 64, "height": 48}],
               "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    (tmp_path / "a.json").write_text(json.dumps(dataset))
    report = validate_coco_json(tmp_path / "a.json", tmp_path, on_error="skip")
    assert dict(report.skipped) == {"image_mode_unreadable": 1}, report.summary()


def test_training_mapper_and_predict_read_a_16bit_copy_as_the_8bit_one(detector, tmp_path):
    from winpos.d2.data import build_lsj_mapper
    from winpos.d2.predict import predict_images

    cfg, model, _ = detector
    grey8 = np.asarray(Image.fromarray(_scene()).convert("L"))
    (tmp_path / "in8").mkdir()
    (tmp_path / "in16").mkdir()
    eight = _save(tmp_path / "in8", "scene.png", Image.fromarray(grey8))
    sixteen = _save(tmp_path / "in16", "scene.png", Image.fromarray(grey8.astype(np.uint16) * 257))
    assert Image.open(sixteen).mode == "I;16"
    mapper = build_lsj_mapper(is_train=False, image_size=64)
    a, b = ({"file_name": str(p), "height": 48, "width": 64, "image_id": 1} for p in (eight, sixteen))
    assert (mapper(a)["image"] == mapper(b)["image"]).all()  # detectron2's reader gave all 255 for the 16-bit one
    for src in ("in8", "in16"):
        predict_images(cfg, model, [tmp_path / src], tmp_path / f"out_{src[2:]}", 0.0)
    assert (tmp_path / "out_8" / "scene.png").read_bytes() == (tmp_path / "out_16" / "scene.png").read_bytes()

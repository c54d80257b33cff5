"""``python -m winpos.install_d2``: detectron2's pure-Python part into the running environment. The route itself
(download, pip, import) was run on fresh virtual environments (docs/install.md); these tests check its pieces on a
wheel built here with the same layout as sal-detectron2's, so they need no network."""
import base64
import hashlib
import zipfile

import pytest

from winpos import install_d2 as I
from winpos.errors import WinposError

METADATA = """Metadata-Version: 2.1
Name: sal-detectron2
Version: 0.7.2
Summary: Detectron2 is FAIR's next-generation research platform for object detection and segmentation.
Requires-Python: >=3.8
Requires-Dist: Pillow>=7.1
Requires-Dist: numpy<2
Requires-Dist: dataclasses; python_version < "3.7"
Requires-Dist: omegaconf<2.4,>=2.1
Requires-Dist: black
Requires-Dist: packaging
Provides-Extra: all
Requires-Dist: timm; extra == "all"

Long description.
"""


def _wheel(path):
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("detectron2/__init__.py", "__version__ = '0.7.2'\n")
        zf.writestr("detectron2/config/__init__.py", "")
        zf.writestr("detectron2/_C.cpython-310-x86_64-linux-gnu.so", b"\x7fELF")
        zf.writestr("tools/train_net.py", "print('train')\n")
        zf.writestr(f"{I.DIST_INFO}/METADATA", METADATA)
        zf.writestr(f"{I.DIST_INFO}/LICENSE", "Apache License 2.0\n")
        zf.writestr(f"{I.DIST_INFO}/RECORD", "")
    return path


def test_requirements_drop_numpy_pin_black_extras_and_old_markers():
    assert I.wheel_requirements(METADATA) == ["Pillow>=7.1", "omegaconf<2.4,>=2.1", "packaging"]


def test_files_written_without_compiled_part_or_tools_and_recorded(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    reqs = I.install_files(_wheel(tmp_path / I.WHEEL), site)
    assert reqs == ["Pillow>=7.1", "omegaconf<2.4,>=2.1", "packaging"]
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert "detectron2/__init__.py" in files and "detectron2/config/__init__.py" in files
    assert not any("_C." in f or f.startswith("tools") for f in files), files
    info = site / I.DIST_INFO
    meta = (info / "METADATA").read_text()
    assert "Name: sal-detectron2" in meta and "Version: 0.7.2" in meta and "no compiled _C" in meta
    assert "Requires-Dist: numpy" not in meta and "Requires-Dist: black" not in meta
    assert [r for r in meta.splitlines() if r.startswith("Requires-Dist")] == [
        "Requires-Dist: Pillow>=7.1", "Requires-Dist: omegaconf<2.4,>=2.1", "Requires-Dist: packaging"]
    assert (info / "INSTALLER").read_text().strip() == I.INSTALLER
    record = dict(line.split(",", 1) for line in (info / "RECORD").read_text().splitlines())
    assert set(record) == set(files) | {f"{I.DIST_INFO}/RECORD"}  # every file written, for pip uninstall
    data = (site / "detectron2/__init__.py").read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert record["detectron2/__init__.py"] == f"sha256={digest},{len(data)}"
    I._remove_own(site)  # what --force does: its own files go
    assert not (site / "detectron2").exists() and not info.exists()


def test_another_detectron2_is_never_replaced(tmp_path):
    site = tmp_path / "site"
    (site / "detectron2").mkdir(parents=True)
    (site / "detectron2" / "__init__.py").write_text("")
    with pytest.raises(WinposError, match="not installed by winpos.install_d2"):
        I._remove_own(site)
    assert (site / "detectron2" / "__init__.py").is_file()


def test_torchvision_pinned_to_the_installed_torch(monkeypatch):
    import importlib.metadata as md

    versions = {"torch": "2.13.0"}

    def version(name):
        if name not in versions:
            raise md.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(md, "version", version)
    assert I._matching_torchvision("torchvision") == "torchvision==0.28.*"
    assert I._matching_torchvision("shapely") == "shapely"
    versions["torch"] = "2.13.0+cpu"  # PyTorch's own index: PyPI's torchvision would not load (torchvision::nms)
    with pytest.raises(WinposError, match=r"pip install 'torchvision==0.28.\*' --index-url "
                                          r"https://download.pytorch.org/whl/cpu"):
        I._matching_torchvision("torchvision")
    versions["torchvision"] = "0.28.0"
    assert I._matching_torchvision("torchvision") == "torchvision"  # installed: kept as it is


def test_help_and_the_error_line_name_the_command(capsys):
    from winpos.utils.cli import D2_INSTALL

    assert "python -m winpos.install_d2" in D2_INSTALL
    with pytest.raises(SystemExit) as e:
        I.main(["--help"])
    assert e.value.code == 0 and "usage: python -m winpos.install_d2" in capsys.readouterr().out

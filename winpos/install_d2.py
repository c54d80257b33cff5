"""Install detectron2 into this Python environment without a compiler: ``python -m winpos.install_d2``.

detectron2 is not on PyPI, and building it from its repository needs a C++ compiler (and CUDA for its GPU ops).
winpos needs none of its compiled operators (``_C``: deformable convolution, the fast COCO evaluator, rotated boxes;
winpos evaluates with pycocotools and its models use torchvision's ops), so this command installs detectron2's
pure-Python part, the route ``tools/setup_env.sh`` takes in a checkout:

1. pip installs what detectron2 imports and winpos's ``[d2]`` extra (torchvision, fvcore, iopath, omegaconf,
   hydra-core, ...); what is already installed is kept.
2. pip downloads the wheel of ``sal-detectron2==0.7.2`` (a repackaged detectron2; its only wheel is tagged for
   CPython 3.10) for Python 3.10, whatever this interpreter's version, and its SHA-256 is checked.
3. Its ``detectron2`` package is written into this environment's site-packages without the compiled ``_C`` module
   (built for CPython 3.10 on Linux x86_64 only) and without the wheel's top-level ``tools`` scripts (a package
   named ``tools`` would shadow the user's own); a ``sal_detectron2-0.7.2.dist-info`` with a RECORD of these files
   is written beside it (``pip uninstall sal-detectron2`` removes them). Its requirements are the wheel's, less
   ``numpy<2`` (a constraint of the removed ``_C``: the pure-Python part runs on numpy 2) and ``black`` (used only by
   ``LazyConfig.to_py`` to format a config as Python), so ``pip check`` has nothing to report for it.
4. ``import detectron2, detectron2.modeling, detectron2.config`` is checked in a fresh process, and ``pip check``
   runs.

An importable detectron2 is left as it is (``--force`` replaces one this command installed). Exit status 0 when
detectron2 imports at the end, 2 when it cannot be installed here (one ``error:`` line), 1 when pip fails.
Run on Linux x86_64: whole on CPython 3.11, the download and files on 3.10 and 3.12 (docs/install.md).
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

from winpos.errors import EXIT_FAILED, WinposError
from winpos.utils.cli import ArgumentParser, run_cli

PACKAGE = "sal-detectron2"
VERSION = "0.7.2"
WHEEL = "sal_detectron2-0.7.2-cp310-none-any.whl"
WHEEL_SHA256 = "491af0c7f79bdb2d178e46f6cb16a97c4ac968d45c41ea3f6b6435d59bbee561"
DIST_INFO = "sal_detectron2-0.7.2.dist-info"
INSTALLER = "winpos.install_d2"
# the wheel's requirements left out, with the reason (docs/install.md says the same)
DROPPED = {"numpy": "a constraint of the compiled _C, which is not installed",
           "black": "used only by LazyConfig.to_py, to format a config as Python source"}
CHECK = "import detectron2, detectron2.modeling, detectron2.config; print(detectron2.__file__)"


def _pip(*args: str, quiet: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args, "--disable-pip-version-check"] + (["-q"] if quiet else [])
    return subprocess.run(cmd, capture_output=True, text=True)


def _importable() -> str | None:
    """Where detectron2 imports from in a fresh process of this interpreter, or None."""
    res = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True)
    return res.stdout.strip().splitlines()[-1] if res.returncode == 0 and res.stdout.strip() else None


def _requirement_name(line: str) -> str:
    name = line.split(";")[0].strip()
    for stop in "<>=!~[ (":
        name = name.split(stop)[0]
    return name.strip().lower().replace("_", "-")


def wheel_requirements(metadata: str) -> list[str]:
    """The wheel's ``Requires-Dist`` lines that apply here: no extra, no marker for old Pythons, less ``DROPPED``."""
    out = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist: "):
            continue
        req = line[len("Requires-Dist: "):].strip()
        if ";" in req and ("extra ==" in req or "python_version <" in req):
            continue
        if _requirement_name(req) not in DROPPED:
            out.append(req.split(";")[0].strip())
    return out


def d2_extra() -> list[str]:
    """winpos's ``[d2]`` extra as installed winpos declares it (empty for a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        reqs = requires("winpos") or []
    except PackageNotFoundError:
        return []
    return [r.split(";")[0].strip() for r in reqs if ";" in r and 'extra == "d2"' in r.split(";", 1)[1]]


def _matching_torchvision(requirement: str) -> str:
    """A bare ``torchvision`` pinned to the release that matches the installed torch (torch 2.m pairs with
    torchvision 0.(m+15)): left bare, pip would take the newest torchvision and replace torch to suit it."""
    if _requirement_name(requirement) != "torchvision" or requirement.strip() != "torchvision":
        return requirement
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("torchvision")
        return requirement  # installed: pip keeps it
    except PackageNotFoundError:
        pass
    try:
        torch = version("torch")
        major, minor = torch.split("+")[0].split(".")[:2]
    except (PackageNotFoundError, ValueError):
        return requirement
    if major != "2":
        return requirement
    pin = f"torchvision==0.{int(minor) + 15}.*"
    if "+" in torch:  # a build from PyTorch's own index (+cpu, +cu126): PyPI's torchvision would not load with it
        label = torch.split("+", 1)[1]
        raise WinposError(f"torch {torch} is a build from PyTorch's index and torchvision is not installed; install "
                          f"the torchvision built for it first: pip install '{pin}' --index-url "
                          f"https://download.pytorch.org/whl/{label}, then run this again")
    return pin


def _record_line(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={digest},{len(data)}"


def install_files(wheel: Path, site: Path) -> list[str]:
    """Write the wheel's ``detectron2`` package (no ``_C``, no ``tools``) and a dist-info of its own into ``site``;
    returns the requirements the dist-info declares."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"{DIST_INFO}/METADATA").decode()
        license_text = zf.read(f"{DIST_INFO}/LICENSE")
        names = [n for n in zf.namelist() if n.startswith("detectron2/") and not n.endswith("/")
                 and not Path(n).name.startswith("_C.")]
        for name in names:
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))  # output-policy: installed files
    requirements = wheel_requirements(metadata)
    info = site / DIST_INFO
    info.mkdir(exist_ok=True)
    head = [line for line in metadata.split("\n\n", 1)[0].splitlines()
            if not line.startswith(("Requires-Dist:", "Provides-Extra:", "Summary:"))]
    dropped = "; ".join(f"{k}: {why}" for k, why in DROPPED.items())
    (info / "METADATA").write_text(  # output-policy: installed files
        "\n".join(head + [f"Summary: detectron2's pure-Python part from {PACKAGE} {VERSION}, installed by "
                          f"{INSTALLER} (no compiled _C; requirements left out: {dropped})"]
                  + [f"Requires-Dist: {r}" for r in requirements]) + "\n")
    (info / "INSTALLER").write_text(INSTALLER + "\n")  # output-policy: installed files
    (info / "LICENSE").write_bytes(license_text)  # output-policy: installed files
    (info / "top_level.txt").write_text("detectron2\n")  # output-policy: installed files
    rels = names + [f"{DIST_INFO}/{n}" for n in ("METADATA", "INSTALLER", "LICENSE", "top_level.txt")]
    record = "\n".join([_record_line(site, r) for r in rels] + [f"{DIST_INFO}/RECORD,,"]) + "\n"
    (info / "RECORD").write_text(record)  # output-policy: installed files
    return requirements


def _remove_own(site: Path) -> None:
    """Remove a detectron2 this command installed (its RECORD's files), refusing any other."""
    info = site / DIST_INFO
    installer = (info / "INSTALLER").read_text().strip() if (info / "INSTALLER").is_file() else ""
    if installer != INSTALLER:
        raise WinposError(f"{site / 'detectron2'} is there but was not installed by {INSTALLER}; remove it with pip "
                          "(pip uninstall detectron2 / sal-detectron2) first, then run this command again")
    for line in (info / "RECORD").read_text().splitlines():
        path = site / line.split(",")[0]
        if path.is_file():
            path.unlink()
    shutil.rmtree(site / "detectron2", ignore_errors=True)
    shutil.rmtree(info, ignore_errors=True)


def run(argv=None) -> int:
    import argparse

    parser = ArgumentParser(prog="python -m winpos.install_d2", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--force", action="store_true",
                        help="replace a detectron2 this command installed earlier (another install is never touched)")
    parser.add_argument("--no-deps", action="store_true",
                        help="install only detectron2's files, not its requirements or winpos's [d2] extra")
    args = parser.parse_args(argv)
    site = Path(sysconfig.get_paths()["purelib"])
    where = _importable()
    if where and not args.force:
        print(f"detectron2 is already importable here ({where}); nothing to do (--force replaces one installed "
              f"by {INSTALLER})")
        return 0
    if _pip("--version").returncode != 0:
        raise WinposError(f"{sys.executable} has no pip; install it (python -m ensurepip) and run this again")
    if (site / "detectron2").exists() or (site / DIST_INFO).exists():
        _remove_own(site)
    elif where:
        raise WinposError(f"detectron2 at {where} was not installed by {INSTALLER}; --force replaces only its own")
    if not os.access(site, os.W_OK):
        raise WinposError(f"{site} is not writable; run this in a virtual environment you own (python -m venv ...)")
    with tempfile.TemporaryDirectory(prefix="winpos-d2-") as tmp:
        print(f"[install_d2] downloading {PACKAGE}=={VERSION} (its CPython 3.10 wheel, whose Python files any "
              "Python 3 runs)", flush=True)
        res = _pip("download", "--no-deps", "--only-binary=:all:", "--python-version", "3.10", "-d", tmp,
                   f"{PACKAGE}=={VERSION}")
        wheel = Path(tmp) / WHEEL
        if res.returncode != 0 or not wheel.is_file():
            print(res.stderr[-3000:], file=sys.stderr)
            raise WinposError(f"pip could not download {PACKAGE}=={VERSION} (see pip's message above); check the "
                              "network or the package index, or install detectron2 from its repository with a "
                              "compiler")
        sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if sha != WHEEL_SHA256:
            raise WinposError(f"{WHEEL} has SHA-256 {sha}, not the expected {WHEEL_SHA256}: the index serves "
                              "another file; nothing was installed")
        with zipfile.ZipFile(wheel) as zf:
            requirements = wheel_requirements(zf.read(f"{DIST_INFO}/METADATA").decode())
        if not args.no_deps:
            wanted = [_matching_torchvision(r) for r in dict.fromkeys(requirements + d2_extra())]
            print(f"[install_d2] pip install {' '.join(wanted)}", flush=True)
            res = _pip("install", *wanted)
            if res.returncode != 0:
                print(res.stdout[-2000:] + res.stderr[-3000:], file=sys.stderr)
                print("error: pip could not install detectron2's requirements (above); nothing of detectron2 was "
                      "installed", file=sys.stderr)
                return EXIT_FAILED
        install_files(wheel, site)
    print(f"[install_d2] wrote detectron2 {VERSION} (pure Python, no _C) and {DIST_INFO} to {site}", flush=True)
    where = _importable()
    if where is None:
        err = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True).stderr.strip()
        raise WinposError(f"detectron2 was installed to {site} but does not import: "
                          f"{err.splitlines()[-1] if err else 'no message'}; install torch (and torchvision) first")
    check = _pip("check", quiet=False)
    print(f"[install_d2] pip check: {check.stdout.strip() or check.stderr.strip()}")
    print(f"detectron2 imports from {where}; remove it with: pip uninstall {PACKAGE}")
    return 0


def main(argv=None) -> int:
    """The command: ``run`` with bad input turned into one ``error:`` line and exit status 2."""
    return run_cli(run, argv)


if __name__ == "__main__":
    sys.exit(main())

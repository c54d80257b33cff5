"""Safe loading of checkpoints written by other projects: data is read, code is never executed.

Supported files:

* ``.pth`` / ``.pt`` / ``.bin`` / ``.ckpt``: PyTorch's zip format, read with ``torch.load(weights_only=True)``
  (numpy arrays inside are admitted too). A file that is a plain pickle instead (for example a detectron2
  model-zoo dict of numpy arrays renamed to ``.pth``) goes through the restricted unpickler below.
* ``.safetensors``: ``safetensors.torch.load_file``.
* ``.pkl`` / ``.pickle``: detectron2 model-zoo pickles (``{"model": {name: ndarray}, "__author__": ...}`` or the
  Caffe2-style ``{"blobs": {...}}``) through a restricted unpickler that admits only numpy arrays, numpy scalars,
  dtypes and plain containers. Any other class in the pickle is refused by name before it is created.
* a model folder as Hugging Face writes it (``save_pretrained``, a Hub snapshot): its ``model.safetensors`` or
  ``pytorch_model.bin``, or the shards its ``*.index.json`` lists, each read as above.

Every failure is a ``WinposError`` (a ``ValueError``; ``MissingInputError``, also a ``FileNotFoundError``, for a
missing path) that names the path, what was found and what to do; the low-level exception is chained as
``__cause__``. A file of another kind (an image, a text or HTML page, an archive) renamed to a checkpoint suffix is
named as what it is. ``check_finite_state_dict`` refuses NaN / inf weights by name.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from winpos.errors import MissingInputError, WinposError

__all__ = ["load_checkpoint_object", "load_state_dict_file", "unwrap_state_dict", "RestrictedUnpickler",
           "check_finite_state_dict", "sniff_file_kind", "safetensors_metadata"]

TORCH_EXTS = (".pth", ".pt", ".bin", ".ckpt")
PICKLE_EXTS = (".pkl", ".pickle")
SAFETENSORS_EXTS = (".safetensors",)

# Containers other projects wrap their state dicts in, tried in this order: ``model_state`` (official Hiera),
# ``model`` (MAE, SAM2, detectron2), ``state_dict``, ``module``, ``blobs`` (Caffe2 / Detectron1 pickles).
CONTAINER_KEYS = ("model_state", "model", "state_dict", "module", "blobs")

_CONVERT_HINT = (
    "convert it once, in an environment where you trust the file, to a plain state dict of tensors: "
    "`sd = {loader}; torch.save({{k: torch.as_tensor(v) for k, v in sd.items() if hasattr(v, 'shape')}}, "
    "'clean.pth')` "
    "(or safetensors.torch.save_file) and load clean.pth instead"
)
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # torch.serialization.MAGIC_NUMBER
_PICKLE_LOADER = "pickle.load(open(path, 'rb'), encoding='latin1')['model']"
_TORCH_LOADER = "<load it with torch.load, weights-only mode off, only if you trust it>['model']"


def _numpy_globals() -> dict[tuple[str, str], Any]:
    """The numpy callables a pickled ndarray / scalar / dtype refers to, under old and new module names.

    The objects are taken from numpy's own ``__reduce__`` output so that we never import the deprecated
    ``numpy.core`` shim and stay correct across numpy 1.x and 2.x.
    """
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    scalar = np.float32(0).__reduce__()[0]
    frombuffer = np.zeros(1).__reduce_ex__(5)[0]  # protocol-5 path of ndarray pickling
    allowed = {}
    for mod in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(mod, "_reconstruct")] = reconstruct
        allowed[(mod, "scalar")] = scalar
    for mod in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(mod, "_frombuffer")] = frombuffer
    allowed[("numpy", "ndarray")] = np.ndarray
    allowed[("numpy", "dtype")] = np.dtype
    return allowed


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    **_numpy_globals(),
    ("collections", "OrderedDict"): collections.OrderedDict,
    # protocol-2 pickles written by Python 3 store bytes as _codecs.encode(str, "latin1"): a pure function.
    ("_codecs", "encode"): __import__("codecs").encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only numpy arrays, numpy scalars, dtypes and ``OrderedDict``.

    Builtin containers (dict, list, tuple, str, bytes, numbers) need no global and are always available.
    Anything else (``builtins.open``, ``os.system``, ``torch._utils._rebuild_tensor_v2``, user classes) raises
    ``pickle.UnpicklingError`` naming the refused class, before it can be called.
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load global '{module}.{name}'") from None


def _to_torch(obj: Any) -> Any:
    """Recursively turn numpy arrays into CPU tensors (and numpy scalars into Python numbers)."""
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind not in "biufc":
            return obj  # strings / objects are not weights; keep them as they are
        # copy: pickled arrays may be read-only or big-endian, which torch.from_numpy rejects
        return torch.from_numpy(np.array(obj, dtype=obj.dtype.newbyteorder("=")))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return type(obj)((k, _to_torch(v)) for k, v in obj.items()) if isinstance(obj, collections.OrderedDict) \
            else {k: _to_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_torch(v) for v in obj)
    return obj


def _check_file(path: Path) -> None:
    if not path.exists():
        raise MissingInputError(f"checkpoint '{path}' does not exist; check the path (cwd is {os.getcwd()})")
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir())[:10]
        raise WinposError(
            f"checkpoint path '{path}' is a directory (it holds {inside}); pass the weights file inside it, "
            f"e.g. '{path}/model.safetensors' or '{path}/model_final.pkl'"
        )
    if path.stat().st_size == 0:
        raise WinposError(f"checkpoint '{path}' is an empty file (0 bytes); the download or save was "
                          "interrupted: fetch it again")


# A Hugging Face model folder (save_pretrained, or a Hub snapshot): its weights file, or the index of its shards.
MODEL_FOLDER_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json")


def _load_model_folder(path: Path) -> dict[str, torch.Tensor]:
    """The state dict of a model folder as ``save_pretrained`` writes it (``config.json`` beside the weights): the first
    of ``MODEL_FOLDER_FILES`` it holds; a sharded one is read shard by shard as its index lists them (every shard read
    as data), and a shard the index names but the folder lacks, or a tensor the index names but no shard holds, is
    an error. Any other directory is refused, naming what it holds."""
    found = next((name for name in MODEL_FOLDER_FILES if (path / name).is_file()), None)
    if found is None:
        inside = sorted(p.name for p in path.iterdir())[:10]
        raise WinposError(
            f"checkpoint path '{path}' is a directory (it holds {inside}) without a model file "
            f"({', '.join(MODEL_FOLDER_FILES)}); pass the weights file inside it, e.g. '{path}/model_final.pth'")
    if not found.endswith(".index.json"):
        return load_checkpoint_object(path / found)
    index_path = path / found
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError("empty weight_map")
    except (ValueError, KeyError, TypeError) as e:
        raise WinposError(f"'{index_path}' is not a shard index (a JSON object with a 'weight_map' of tensor -> "
                          f"file): {e}; fetch the folder again") from None
    shards = sorted(set(weight_map.values()))
    missing = [name for name in shards if not (path / name).is_file()]
    if missing:
        raise MissingInputError(f"'{index_path}' names {len(shards)} shards but {len(missing)} are not in the folder "
                                f"(e.g. {missing[:3]}); the download is incomplete: fetch them again")
    out: dict[str, torch.Tensor] = {}
    for name in shards:
        shard = unwrap_state_dict(load_checkpoint_object(path / name), source=f"shard '{path / name}'")
        twice = sorted(set(shard) & set(out))
        if twice:
            raise WinposError(f"shard '{path / name}' repeats tensors of another shard (e.g. {twice[:3]}); the folder "
                              "mixes two models: fetch it again")
        out.update(shard)
    absent = sorted(set(weight_map) - set(out))
    if absent:
        raise WinposError(f"'{index_path}' lists {len(absent)} tensors no shard holds (e.g. {absent[:3]}); the shards "
                          "are from another version of the model: fetch the folder again")
    return out


def _load_restricted_pickle(path: Path) -> Any:
    """Read a plain pickle with ``RestrictedUnpickler``; returns the object with arrays turned into tensors."""
    try:
        with open(path, "rb") as f:
            # latin1: detectron2 zoo pickles may come from Python 2, whose str holds raw array bytes
            obj = RestrictedUnpickler(f, encoding="latin1").load()
    except pickle.UnpicklingError as e:
        if str(e).startswith("refused to load global"):
            raise WinposError(
                f"checkpoint '{path}' contains pickled code/objects that winpos won't execute ({e}); only numpy "
                f"arrays and plain containers are accepted from pickles. If you trust the file, "
                + _CONVERT_HINT.format(loader=_PICKLE_LOADER)
            ) from e
        raise _corrupt(path, e) from e
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError, MemoryError,
            UnicodeDecodeError, OverflowError) as e:
        raise _corrupt(path, e) from e
    return _to_torch(obj)


_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"BM", "a BMP image"), (b"RIFF", "a RIFF (WebP/WAV) file"), (b"%PDF", "a PDF document"),
    (b"\x1f\x8b", "a gzip archive (unpack it first)"), (b"7z\xbc\xaf", "a 7-zip archive (unpack it first)"),
    (b"\x7fELF", "an executable"), (b"\x89HDF", "an HDF5 file (Keras/TF weights; convert them to PyTorch first)"),
)


def sniff_file_kind(path) -> str | None:
    """What a file that is not a checkpoint looks like (``"a PNG image"``, ``"an HTML page"``, ...), or None."""
    with open(path, "rb") as f:
        head = f.read(512)
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            return kind
    text = head.lstrip().lower()
    if text.startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a download that returned a web page: use the direct file link)"
    if text.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer (run `git lfs pull` to fetch the real file)"
    if head and all(32 <= b < 127 or b in b"\r\n\t" for b in head):
        return "a text file"
    return None


def _corrupt(path: Path, err: BaseException) -> ValueError:
    size = path.stat().st_size
    kind = sniff_file_kind(path)
    if kind:
        return WinposError(f"checkpoint '{path}' ({size} bytes) is {kind}, not a checkpoint; pass the weights file "
                           "(.pth, .pt, .pkl or .safetensors)")
    return WinposError(
        f"checkpoint '{path}' ({size} bytes) could not be read: it looks truncated or corrupt "
        f"({type(err).__name__}: {str(err).split('. ')[0][:200] or 'unexpected end of data'}); download or save it "
        "again and compare its size/checksum with the source"
    )


def _load_torch(path: Path) -> Any:
    numpy_safe = [v for (mod, _), v in _ALLOWED_GLOBALS.items() if mod.startswith("numpy")]
    # torch's unpickler also checks the class that BUILD restores a dtype into (numpy.dtypes.Float32DType...)
    numpy_safe += [type(np.dtype(c)) for c in np.typecodes["All"] if c not in "OMmUSV"]
    try:
        with torch.serialization.safe_globals(numpy_safe):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "Weights only load failed" not in str(e):
            raise _corrupt(path, e) from e
        found = ""
        try:
            bad = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
            found = f" (it refers to {sorted(set(bad))[:8]})" if bad else ""
        except Exception:  # noqa: BLE001 - only used to enrich the message
            pass
        raise WinposError(
            f"checkpoint '{path}' contains pickled code/objects that winpos won't execute{found}; "
            f"torch.load(weights_only=True) refused it. If you trust the file, "
            + _CONVERT_HINT.format(loader=_TORCH_LOADER)
        ) from e
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile, ValueError, KeyError) as e:
        raise _corrupt(path, e) from e
    return _to_torch(obj)


def _load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError and OS errors
        raise _corrupt(path, e) from e


def safetensors_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The string metadata of a ``.safetensors`` file's header (where ``winpos-convert`` records ``winpos_preset``,
    ``winpos_kwargs``, ``winpos_image_size``, ...), read without loading a tensor; ``{}`` for another suffix or a
    file that cannot be read (the checkpoint loader refuses such a file with its reason when it loads it)."""
    if not str(path).lower().endswith(".safetensors"):
        return {}
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            return dict(f.metadata() or {})
    except Exception:  # noqa: BLE001 - safetensors raises its own SafetensorError and OS errors
        return {}


def load_checkpoint_object(path: str | os.PathLike) -> Any:
    """Load the raw container of a checkpoint file without executing code.

    Args:
        path: a ``.pth/.pt/.bin/.ckpt``, ``.safetensors`` or ``.pkl/.pickle`` file, or a model folder as Hugging Face
            writes it (``_load_model_folder``: ``model.safetensors``, sharded or not, or ``pytorch_model.bin``).
    Returns:
        The object as stored (e.g. ``{"model": {...}}``, ``{"model_state": {...}}`` or a flat state dict), with
        every numeric numpy array turned into a CPU ``torch.Tensor``.
    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: a directory without a model file, empty/truncated/corrupt file, unknown extension, or a pickle
            that holds code.
    """
    path = Path(path)
    if path.is_dir():
        return _load_model_folder(path)
    _check_file(path)
    ext = path.suffix.lower()
    if ext in SAFETENSORS_EXTS:
        return _load_safetensors(path)
    if ext not in TORCH_EXTS + PICKLE_EXTS:
        raise WinposError(
            f"checkpoint '{path}' has an unknown extension '{path.suffix}'; winpos reads "
            f"{', '.join(TORCH_EXTS + PICKLE_EXTS + SAFETENSORS_EXTS)}: rename the file if it is one of these"
        )
    # Dispatch on content, not the name: zoo files named .pkl can be torch zips and vice versa. A zip signature
    # without a readable archive (a cut-off torch.save file) also goes to torch, whose error we chain.
    with open(path, "rb") as f:
        zip_signature = f.read(2) == b"PK"
    if zip_signature or zipfile.is_zipfile(path):
        return _load_torch(path)
    obj = _load_restricted_pickle(path)  # reads the first pickle in the file only
    if isinstance(obj, int) and obj == _TORCH_LEGACY_MAGIC:  # PyTorch's pre-1.6 format starts with this number
        return _load_torch(path)
    return obj


def unwrap_state_dict(obj: Any, source: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Return the flat ``name -> Tensor`` mapping inside a checkpoint container.

    Looks through the usual wrappers in order (``model_state`` for official Hiera, ``model`` for MAE / SAM2 /
    detectron2, ``state_dict``, ``module``, Caffe2-style ``blobs``) and keeps the tensor entries only; numeric numpy
    arrays (a detectron2 ``.pkl`` loaded by hand) become tensors. This is the one unwrapper: the importers, the
    diagnostics and the detectron2 checkpointer all use it.
    """
    if not isinstance(obj, dict):
        raise WinposError(f"{source} holds a {type(obj).__name__}, not a dict of tensors; save the model's "
                          "state_dict() rather than the model object")
    if any(isinstance(v, (np.ndarray, dict)) for v in obj.values()):
        obj = _to_torch(obj)
    for key in CONTAINER_KEYS:
        inner = obj.get(key)
        if isinstance(inner, dict) and any(isinstance(v, torch.Tensor) for v in inner.values()):
            obj = inner
            break
    flat = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not flat:
        sample = [str(k) for k in list(obj.keys())[:12]]
        raise WinposError(f"{source} has no tensors at the top level or under {list(CONTAINER_KEYS)}; its keys "
                          f"are {sample}: pass a file saved with torch.save(model.state_dict())")
    return flat


def load_state_dict_file(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Load a checkpoint file and return its flat ``name -> Tensor`` state dict (container unwrapped)."""
    return unwrap_state_dict(load_checkpoint_object(path), source=f"checkpoint '{path}'")



def check_finite_state_dict(state_dict, source: str = "checkpoint") -> None:
    """Raise a WinposError naming the tensors of ``state_dict`` that hold NaN or inf (at most 5 named).

    Such weights would load silently and turn every output into NaN (or stop training at its first step).
    """
    bad = [k for k, v in state_dict.items() if isinstance(v, torch.Tensor) and (v.is_floating_point() or
           v.is_complex()) and v.numel() and not bool(torch.isfinite(v).all())]
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise WinposError(f"{source} has NaN/inf values in {len(bad)} tensors ({', '.join(bad[:5])}{more}); the "
                          "file is corrupt or was saved after training diverged: use an earlier checkpoint")

"""Safe checkpoint loading: round trips per format, and clear refusals for code, corrupt and odd files.

The security tests plant a pickle whose unpickling would create a file; the oracle is the file system: the file
must not exist afterwards.
"""

import collections
import os
import pickle

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from winpos.checkpoints.io import (load_checkpoint_object, load_state_dict_file, safetensors_metadata,
                                  unwrap_state_dict)


class _WritesFile:
    """Unpickling this calls open(target, "w"), which creates the file: the payload we must never run."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def _sd():
    g = torch.Generator().manual_seed(0)
    return {"pos_embed": torch.randn(1, 197, 8, generator=g), "blocks.0.attn.qkv.weight": torch.randn(24, 8, generator=g),
            "steps": torch.tensor(3, dtype=torch.int64)}


def _assert_same(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


# ---- round trips -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ext", [".pth", ".pt", ".bin"])
def test_torch_round_trip_with_container(tmp_path, ext):
    sd = _sd()
    path = tmp_path / f"ckpt{ext}"
    torch.save({"model_state": sd, "epoch": 3}, path)
    obj = load_checkpoint_object(path)
    assert obj["epoch"] == 3
    _assert_same(obj["model_state"], sd)
    _assert_same(load_state_dict_file(path), sd)


def test_safetensors_round_trip(tmp_path):
    sd = _sd()
    save_file(sd, str(tmp_path / "m.safetensors"))
    _assert_same(load_state_dict_file(tmp_path / "m.safetensors"), sd)


def test_safetensors_metadata_is_read_without_the_tensors(tmp_path):
    """winpos-convert's records (preset, kwargs, image size) come back as written; a file of another suffix or a
    damaged header gives {} (the loader refuses that file with its reason when it loads it)."""
    path = tmp_path / "w.safetensors"
    meta = {"winpos_preset": "vitdet_b", "winpos_kwargs": '{"window_size": 16}', "winpos_image_size": "1024"}
    save_file(_sd(), str(path), metadata=meta)
    assert safetensors_metadata(path) == meta
    save_file(_sd(), str(tmp_path / "bare.safetensors"))
    assert safetensors_metadata(tmp_path / "bare.safetensors") == {}
    torch.save({"model": _sd(), "winpos_preset": "vitdet_b"}, tmp_path / "w.pth")
    assert safetensors_metadata(tmp_path / "w.pth") == {}
    (tmp_path / "cut.safetensors").write_bytes(path.read_bytes()[:20])
    assert safetensors_metadata(tmp_path / "cut.safetensors") == {}
    with pytest.raises(ValueError, match="cut.safetensors"):
        load_checkpoint_object(tmp_path / "cut.safetensors")


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_detectron2_style_pkl_of_numpy(tmp_path, protocol):
    g = np.random.default_rng(0)
    model = collections.OrderedDict(
        [("backbone.net.pos_embed", g.standard_normal((1, 197, 8)).astype(np.float32)),
         ("backbone.net.blocks.0.attn.rel_pos_h", g.standard_normal((27, 4))),  # float64
         ("roi_heads.box_predictor.cls_score.bias", np.asfortranarray(g.standard_normal((3, 2)).astype(">f4"))),
         ("iters", np.int64(90000))]
    )
    path = tmp_path / "model_final.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": model, "__author__": "Detectron2 ViTDet Model Zoo", "matching_heuristics": True},
                    f, protocol=protocol)
    obj = load_checkpoint_object(path)
    assert obj["__author__"] == "Detectron2 ViTDet Model Zoo"
    assert obj["model"]["iters"] == 90000
    for k in ("backbone.net.pos_embed", "backbone.net.blocks.0.attn.rel_pos_h", "roi_heads.box_predictor.cls_score.bias"):
        t = obj["model"][k]
        assert isinstance(t, torch.Tensor)
        np.testing.assert_array_equal(t.numpy(), model[k])
    assert obj["model"]["backbone.net.blocks.0.attn.rel_pos_h"].dtype == torch.float64
    flat = load_state_dict_file(path)
    assert set(flat) == {k for k in model if k != "iters"}


def test_caffe2_blobs_and_numpy_pickle_named_pth(tmp_path):
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "caffe2_style.pth"  # a plain pickle under a torch extension: dispatched on content
    with open(path, "wb") as f:
        pickle.dump({"blobs": {"conv1_w": arr}}, f)
    sd = load_state_dict_file(path)
    np.testing.assert_array_equal(sd["conv1_w"].numpy(), arr)


def test_torch_zip_holding_numpy_arrays(tmp_path):
    arr = np.linspace(0, 1, 6, dtype=np.float32)
    torch.save({"model": {"w": arr}}, tmp_path / "np_inside.pth")
    np.testing.assert_array_equal(load_state_dict_file(tmp_path / "np_inside.pth")["w"].numpy(), arr)


def test_legacy_torch_format(tmp_path):
    sd = _sd()
    torch.save(sd, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    _assert_same(load_state_dict_file(tmp_path / "legacy.pth"), sd)


# ---- code in the pickle ----------------------------------------------------------------------------------------

def test_pkl_with_code_is_refused_and_not_run(tmp_path):
    target = tmp_path / "pwned_pkl"
    path = tmp_path / "evil.pkl"
    with open(path, "wb") as f:
        pickle.dump({"model": {"w": np.ones(2)}, "x": _WritesFile(target)}, f)
    with pytest.raises(ValueError, match=r"pickled code/objects.*(io|builtins)\.open") as ei:
        load_checkpoint_object(path)
    assert str(path) in str(ei.value) and "convert" in str(ei.value)
    assert isinstance(ei.value.__cause__, pickle.UnpicklingError)
    assert not target.exists()


def test_pth_with_code_is_refused_and_not_run(tmp_path):
    target = tmp_path / "pwned_pth"
    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.ones(2)}, "x": _WritesFile(target)}, path)
    with pytest.raises(ValueError, match="pickled code/objects that winpos won't execute") as ei:
        load_state_dict_file(path)
    assert str(path) in str(ei.value) and ".open" in str(ei.value)
    assert not target.exists()


def test_plain_pickle_of_torch_tensors_is_refused(tmp_path):
    # torch tensors pickled without torch.save rebuild through torch internals, which we do not admit
    path = tmp_path / "raw_tensor.pkl"
    with open(path, "wb") as f:
        pickle.dump({"w": torch.ones(2)}, f)
    with pytest.raises(ValueError, match=r"refused to load global 'torch\."):
        load_checkpoint_object(path)


# ---- broken and odd files --------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint_object(tmp_path / "nope.pth")


@pytest.mark.parametrize("ext", [".pth", ".pkl", ".safetensors"])
def test_empty_file(tmp_path, ext):
    path = tmp_path / f"empty{ext}"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty file") as ei:
        load_checkpoint_object(path)
    assert str(path) in str(ei.value)


@pytest.mark.parametrize("kind", ["pth", "pkl", "safetensors", "legacy"])
def test_truncated_file(tmp_path, kind):
    full = tmp_path / f"full.{kind}"
    sd = _sd()
    if kind == "pth":
        torch.save({"model": sd}, full)
    elif kind == "legacy":
        torch.save({"model": sd}, full, _use_new_zipfile_serialization=False)
    elif kind == "safetensors":
        save_file(sd, str(full))
    else:
        with open(full, "wb") as f:
            pickle.dump({"model": {k: v.numpy() for k, v in sd.items()}}, f)
    data = full.read_bytes()
    cut = tmp_path / f"cut.{'pth' if kind == 'legacy' else kind}"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated or corrupt") as ei:
        load_checkpoint_object(cut)
    msg = str(ei.value)
    assert str(cut) in msg and f"({len(data) // 2} bytes)" in msg and "again" in msg
    assert ei.value.__cause__ is not None


def test_directory(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"is a directory \(it holds \['config.json'\]\) without a model file "
                                         r"\(model\.safetensors"):
        load_checkpoint_object(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"x")  # a model folder: its weights file is read, and checked
    with pytest.raises(ValueError, match=r"model\.safetensors"):
        load_checkpoint_object(tmp_path)


def test_unknown_extension(tmp_path):
    path = tmp_path / "weights.h5"
    path.write_bytes(b"\x89HDF")
    with pytest.raises(ValueError, match=r"unknown extension '\.h5'.*\.safetensors"):
        load_checkpoint_object(path)


def test_unwrap_without_tensors_names_keys():
    with pytest.raises(ValueError, match=r"no tensors.*'epoch'"):
        unwrap_state_dict({"epoch": 3, "optimizer": {}})
    with pytest.raises(ValueError, match="not a dict"):
        unwrap_state_dict([torch.ones(1)])


def test_no_file_created_anywhere_by_refusals(tmp_path, monkeypatch):
    # belt and braces: run the refusals with cwd in tmp_path and check nothing new appeared there
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil2.pkl"
    with open(path, "wb") as f:
        pickle.dump(_WritesFile("relative_pwned"), f)
    before = set(os.listdir(tmp_path))
    with pytest.raises(ValueError):
        load_checkpoint_object(path)
    assert set(os.listdir(tmp_path)) == before

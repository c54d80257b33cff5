"""The launches ``window_attention`` makes for ViTDet-B, HieraDet-B+ and HieraDet-L at 1024^2 (bf16) compile for
sm_90a (H100/H200), and what the compiler made of them is fast-path code: the regression guard for the kernels'
performance before any GPU run.

``aot_compile.py`` builds q, k, v as the backbones do (qkv views, pooled queries), runs the real dispatch forward
and backward with launches recorded, specializes each launch with Triton's own runtime binder and compiles it for
sm_90a with the launch's warps and stages, in one fresh process per session. Every shape of ``aot_compile.py`` with
every position term (``--all``: 144 launches, 102 distinct kernels; about 2 min on 2 cores with Triton's cache
cold, 1 min warm). The checks, per kernel and shape:

* vector access: no 2-byte global loads or stores when every 16-bit tensor is 16-byte aligned;
* cp.async: 16-byte ``LDGSTS`` (the software pipeliner's asynchronous copies) in every kernel's main loop;
* no register spills;
* no ptxas C7515 ("wgmma serialized").

A known shortfall is an ``xfail(strict=True)`` entry in ``KNOWN`` with the reason and the planned fix: the
entry must go when the fix lands (a strict xfail that passes fails the suite). What differs between the Triton
releases it was measured under (3.8, the project's; 3.6, the lent GPU image's) is in ``KNOWN_BY_TRITON``; under
any other release the module refuses to run until it has been measured there. Set ``WINPOS_COMPILE_TABLE`` to a
file path to write the compile table (markdown) this check measured.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.aot_compile import EVERYTHING, KERNELS, markdown, row_id

pytestmark = pytest.mark.slow  # every test reads the module's compile of every launch: 135 s
HERE = Path(__file__).resolve().parent
ROW_IDS = [row_id(shape, term, kernel) for shape, term in EVERYTHING for kernel in KERNELS]

# check -> [(row-id regex, reason)]: what the sm_90a compile still shows and why.
KNOWN = {
    "vector_access": [],
    "cp_async": [],
    "no_spills": [],
    "no_serialized_wgmma": [],
}


# The same checks per Triton release (major, minor): what that compiler does differently, measured. Triton 3.6 is
# the lent GPU image's; the project pins 3.8 (torch 2.14.1). Under 3.6 (2026-12-02, --all, 331 s) every check
# holds except these twelve dK/dV kernels, which reach 255 registers and spill 8-64 B (3.8: 201-249, none).
_SPILL_36 = "because Triton 3.6 allocates these dK/dV kernels 255 registers and spills 8-64 B (3.8: none)"
KNOWN_BY_TRITON = {
    (3, 6): {"no_spills": [(re.escape(rid), _SPILL_36) for rid in (
        "ViTDet-B global D64 relpos attn_bwd_dkdv", "Hiera-B+ s2 w4 D56 none attn_bwd_dkdv",
        "Hiera-B+ s2 w4 D56 rope attn_bwd_dkdv", "Hiera-B+ s2>3 pool D56 none attn_bwd_dkdv",
        "Hiera-B+ s2>3 pool D56 rope attn_bwd_dkdv", "Hiera-B+ s3 w14 pad D56 none attn_bwd_dkdv",
        "Hiera-B+ s3 w14 pad D56 rope attn_bwd_dkdv", "Hiera-B+ s3 w14 pad D56 lookhere attn_bwd_dkdv",
        "Hiera-B+ s3 global D56 relpos attn_bwd_dkdv", "Hiera-B+ s4 w7 pad D56 none attn_bwd_dkdv",
        "Hiera-B+ s4 w7 pad D56 rope attn_bwd_dkdv", "Hiera-B+ s4 w7 pad D56 lookhere attn_bwd_dkdv")]},
    (3, 8): {},
}


def _triton_release() -> tuple:
    import triton

    release = tuple(int(x) for x in triton.__version__.split(".")[:2])
    if release not in KNOWN_BY_TRITON:
        raise RuntimeError(f"the sm_90a compile checks were measured under Triton {sorted(KNOWN_BY_TRITON)}, not "
                           f"{triton.__version__}: run them once under it and record what differs in KNOWN_BY_TRITON")
    return release


def _known(check: str, rid: str):
    for pattern, reason in KNOWN[check] + KNOWN_BY_TRITON[_triton_release()].get(check, []):
        if re.search(pattern, rid):
            return reason
    return None


def _params(check: str):
    return [pytest.param(rid, id=rid, marks=pytest.mark.xfail(strict=True, reason=reason) if reason else ())
            for rid in ROW_IDS for reason in [_known(check, rid)]]


@pytest.fixture(scope="module")
def rows():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(HERE / "aot_compile.py"), "--all", "--json"], cwd=HERE.parents[1],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    if os.environ.get("WINPOS_COMPILE_TABLE"):
        Path(os.environ["WINPOS_COMPILE_TABLE"]).write_text(markdown(result))
    return {r["id"]: r for r in result}


def test_every_dispatched_launch_compiles_for_sm90a(rows):
    assert list(rows) == ROW_IDS  # fwd, dQ, dK/dV for every shape x term, in order
    assert all(r["regs"] > 0 for r in rows.values()), "ptxas reported no register count"


@pytest.mark.parametrize("rid", _params("vector_access"))
def test_aligned_data_gets_16_byte_accesses(rows, rid):
    r = rows[rid]
    assert r["aligned"], f"{rid}: the launch's 16-bit tensors are not all 16-byte aligned"
    assert (r["ldg16"], r["stg16"]) == (0, 0), f"{rid}: 2-byte loads/stores {r['ldg16']}/{r['stg16']}"


@pytest.mark.parametrize("rid", _params("cp_async"))
def test_main_loop_is_pipelined_with_cp_async(rows, rid):
    assert rows[rid]["cp16"] > 0, f"{rid}: no 16-byte LDGSTS (cp.async) in the SASS"


@pytest.mark.parametrize("rid", _params("no_spills"))
def test_no_register_spills(rows, rid):
    r = rows[rid]
    assert r["spill"] == 0, f"{rid}: {r['spill']} bytes of spill stores + loads at {r['regs']} registers"


@pytest.mark.parametrize("rid", ROW_IDS)
def test_shared_memory_fits_sm90_and_its_estimate(rows, rid):
    """What ptxas allocates stays under the 227 KB an sm_90 program may use and under
    ``launch_config.shared_estimate``, the bound ``set_tuned`` and the sweep apply to options never compiled."""
    from winpos.kernels.launch_config import SHARED_LIMIT

    r = rows[rid]
    assert 0 < r["shared"] <= SHARED_LIMIT, f"{rid}: {r['shared']} bytes of shared memory"
    assert r["shared"] <= r["shared_estimate"], f"{rid}: {r['shared']} bytes > estimate {r['shared_estimate']}"


@pytest.mark.parametrize("rid", _params("no_serialized_wgmma"))
def test_no_serialized_wgmma(rows, rid):
    assert "C7515" not in rows[rid]["warnings"], f"{rid}: ptxas C7515, wgmma serialized"

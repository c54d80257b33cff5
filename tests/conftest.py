"""Test-wide settings: deterministic seeds, a hypothesis profile sized for CI, and oracle imports that fail loudly."""
import importlib
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "winpos", max_examples=int(os.environ.get("WINPOS_HYPOTHESIS_EXAMPLES", "25")), deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("winpos")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def require(module: str):
    """Import an oracle package; a missing oracle is a test failure with the fix, never a skip."""
    try:
        return importlib.import_module(module)
    except ImportError as e:  # pragma: no cover - only when the environment is broken
        pytest.fail(f"oracle package {module!r} is not importable ({e}); run `bash tools/setup_env.sh`")

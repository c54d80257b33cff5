"""Weight initializers and comparisons shared by the parity tests."""
import torch
import torch.nn as nn


def randomize_(module, seed=1, std=0.2):
    """Non-zero random values in every parameter (norm weights around 1), so no term can hide behind a zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * noise if "norm" in name and name.endswith("weight") else std * noise)
    return module


def randomize(module: nn.Module) -> nn.Module:
    """Non-trivial random weights: O(1) attention logits, so relpos / position terms visibly change outputs."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "rel_pos" in name or "pos_embed" in name:
                p.normal_(0, 0.5)
            elif p.dim() > 1:
                p.normal_(0, p[0].numel() ** -0.5)
            elif "norm" in name and name.endswith("weight"):
                p.normal_(1, 0.1)
            else:
                p.normal_(0, 0.1)
    return module.eval()


def assert_features_close(ours, ref, rtol=1e-4):
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert o.shape == r.shape
        torch.testing.assert_close(o, r, rtol=rtol, atol=rtol * r.abs().max().item())

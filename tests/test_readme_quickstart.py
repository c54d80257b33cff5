"""The README's quick start runs as written: the python block between the quickstart markers is executed line for
line in a temporary folder holding a small made-up checkpoint of the name it uses (an MAE-layout ViT-B: patch
embedding, cls token and position embedding only, so it is quick to write and read)."""
import os
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def quickstart_code() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart:begin -->\n(.*?)<!-- quickstart:end -->", text, re.S)
    assert block, "README.md has no <!-- quickstart:begin --> ... <!-- quickstart:end --> block"
    code = re.fullmatch(r"\s*```python\n(.*?)```\s*", block.group(1), re.S)
    assert code, "the quickstart block must be one ```python fence"
    return code.group(1)


def made_up_mae_checkpoint(path: Path, dim=768, grid=14, patch=16):
    g = torch.Generator().manual_seed(0)
    window = torch.randn(dim, grid, grid, generator=g)  # one 14x14 window: what abs-win tiles at every window
    torch.save({"model": {"cls_token": torch.zeros(1, 1, dim),
                          "pos_embed": torch.cat([torch.zeros(1, 1, dim), window.flatten(1).T[None]], 1),
                          "patch_embed.proj.weight": 0.02 * torch.randn(dim, 3, patch, patch, generator=g),
                          "patch_embed.proj.bias": torch.zeros(dim)}}, path)


def test_readme_quickstart_runs_as_written(tmp_path, capsys):
    code = quickstart_code()
    for name in set(re.findall(r'"([\w.]+\.pth)"', code)):
        made_up_mae_checkpoint(tmp_path / name)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        scope = {"__name__": "__quickstart__"}
        exec(compile(code, "README.md quickstart", "exec"), scope)
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out
    # abs-win: no bug; its global relpos tables, sized for 1024 px, are squeezed at 448 (a warning, not the bug)
    assert "[BUG] preset vitdet_b" in out and "[WARN] preset vitdet_b (recipe paper)" in out
    assert "tables SQUEEZED 127 -> 55" in out
    assert "broken:" in out  # a one-window MAE embedding interpolated to 28x28 tokens breaks window alignment
    assert "abs -> abs-win" in out and scope["feats"].shape == (1, 768, 28, 28)
    assert torch.isfinite(scope["feats"]).all()
    # the converted embedding is the one in the model (the load took effect), tiled per window
    torch.testing.assert_close(scope["net"].pos_embed.window_embed, scope["sd"]["pos_embed.window_embed"])
    assert sorted(p.suffix for p in (tmp_path / "posemb").iterdir()) == [".json"] + [".png"] * 3

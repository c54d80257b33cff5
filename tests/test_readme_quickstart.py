"""The README's quick start runs as written, top to bottom, on a fresh machine: the python block between the
quickstart markers is executed line for line in an empty temporary folder, with nothing downloaded or planted first.
The checkpoint it reads is the one shipped with winpos (``winpos.model_zoo.demo_checkpoint``), so no step needs a
file that a later section of the README (or the network) provides."""
import importlib
import os
import re
import shlex
from pathlib import Path

import torch

from winpos.cli import COMMANDS
from winpos.model_zoo import demo_checkpoint, list_configs

ROOT = Path(__file__).resolve().parents[1]


def quickstart_code() -> str:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- quickstart:begin -->\n(.*?)<!-- quickstart:end -->", text, re.S)
    assert block, "README.md has no <!-- quickstart:begin --> ... <!-- quickstart:end --> block"
    code = re.fullmatch(r"\s*```python\n(.*?)```\s*", block.group(1), re.S)
    assert code, "the quickstart block must be one ```python fence"
    return code.group(1)


def test_readme_quickstart_reads_no_file_it_does_not_ship():
    # a checkpoint named by file would have to be downloaded first (the README's import section comes later)
    code = quickstart_code()
    named = re.findall(r"""["']([^"']+\.(?:pth|pt|pkl|safetensors|bin|npz))["']""", code)
    assert not named, f"the quick start reads {named}, which no earlier step makes: use a shipped checkpoint"
    assert "demo_checkpoint()" in code and demo_checkpoint().is_file()


def test_readme_quickstart_runs_as_written(tmp_path, capsys):
    code = quickstart_code()
    assert not list(tmp_path.iterdir())  # a fresh folder: nothing planted
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
    # the demo's learned window pattern (4x4-token windows at 64 px), naively interpolated to 128 px, breaks
    assert "at 128x128 px (32x32 tokens, 4x4-token windows): broken:" in out
    # abs -> abs-win is exact with the 16x16 global grid: nothing reshaped, both parts converted
    assert "2 converted, 0 reshaped" in out and "(exact abs -> abs-win)" in out
    assert "residual of the tiled window embedding (exact)" in out
    feats = scope["feats"]
    assert [tuple(f.shape) for f in feats] == [(1, 48, 32, 32), (1, 96, 16, 16), (1, 192, 8, 8), (1, 384, 4, 4)]
    assert all(torch.isfinite(f).all() for f in feats)
    # the converted embedding is the one in the model (the load took effect; the shipped file is fp16)
    for part in ("window_embed", "global_embed"):
        converted = scope["sd"][f"pos_embed.{part}"]
        torch.testing.assert_close(getattr(scope["net"].pos_embed, part), converted.float(), rtol=0, atol=0)
    assert sorted(p.suffix for p in (tmp_path / "posemb").iterdir()) == [".json"] + [".png"] * 3


def test_readme_commands_read_only_a_config_name_or_what_an_earlier_command_writes():
    # before: the export block read --checkpoint model_final.pth, which no README step makes
    text = (ROOT / "README.md").read_text()
    names, made = set(list_configs()), []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if not argv or argv[0] not in COMMANDS:
                continue
            module = importlib.import_module(f"winpos.cli.{COMMANDS[argv[0]]}")
            if not hasattr(module, "build_parser"):
                continue
            args = module.build_parser().parse_args(argv[1:])
            for flag, value in (("--config-file", getattr(args, "config_file", None)),
                                ("--checkpoint", getattr(args, "checkpoint", None))):
                if value and value not in names:
                    assert any(value.startswith(f"{d}/") for d in made), \
                        f"README: {argv[0]} {flag} {value} is no config name and no earlier command writes it"
            made += [o.split("=", 1)[1] for o in getattr(args, "opts", []) if o.startswith("train.output_dir=")]
    assert made == ["out/mine"]  # the own-data training, which the eval, predict and export lines read from


def test_readme_stays_under_150_lines_with_exactly_two_setup_commands():
    """One place per journey: details live in docs/; the set-up is one install-and-run command and one test
    command, the latter the one CI runs."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 150, f"README.md has {len(text.splitlines())} lines; move details to docs/"
    ci = (ROOT / ".ci" / "run").read_text()
    test_lines = [line.strip() for line in text.splitlines() if "pytest" in line and not line.startswith("#")]
    assert any(line.strip("`$ ") and line.strip("`$ ").split("#")[0].strip() in ci for line in test_lines), \
        "the README's test command is not the one .ci/run calls"

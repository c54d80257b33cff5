"""docs/recipes.md shows its commands as a user of the installed wheel runs them: an installed command
(``winpos-train``, ...; no ``python tools/...``, no ``.venv``), configs by name (``COCO/...``, found by
``winpos.model_zoo``, not a checkout's ``configs/`` path), and flags that the command's own parser accepts."""
import importlib
import re
import shlex
from pathlib import Path

import pytest

from winpos import model_zoo
from winpos.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "recipes.md"


def doc_commands(text: str) -> list[list[str]]:
    """The command lines of a markdown file's ```bash blocks (continuations joined; comments, ``export`` dropped)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0] != "export":
                commands.append(argv)
    return commands


def test_doc_commands_parser():
    text = "x\n```bash\nexport A=1   # a comment\nwinpos-train --resume \\\n    a=1   # note\n```\n"
    assert doc_commands(text) == [["winpos-train", "--resume", "a=1"]]


def test_recipes_commands_are_installed_commands_with_flags_their_parser_accepts():
    commands = doc_commands(DOC.read_text())
    assert len(commands) >= 2, commands  # the training and the SLURM submission at least
    names = set(model_zoo.list_configs())
    for argv in commands:
        assert argv[0] in COMMANDS, f"docs/recipes.md: {shlex.join(argv)!r} is not an installed command"
        assert not any("tools/" in a or ".venv" in a for a in argv), shlex.join(argv)
        module = importlib.import_module(f"winpos.cli.{COMMANDS[argv[0]]}")
        try:
            args = module.build_parser().parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"docs/recipes.md: {argv[0]}'s parser refuses {shlex.join(argv[1:])!r}")
        config = getattr(args, "config_file", None)
        if config is not None:
            assert config in names, f"docs/recipes.md: {config!r} is not a config name of winpos.model_zoo"

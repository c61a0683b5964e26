"""Every ``train.py`` command line in the manual (README.md, docs/, the examples' READMEs) goes through
train.py's own parser, so that a renamed or removed flag cannot leave a command a user copies broken."""

import re
import shlex
from pathlib import Path

import pytest

from vime_ext.arguments import build_parser, split_vllm_args

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("examples/*/README.md"))]
STARTS = ("python train.py", "python -m vime_ext.train ", "python train_async.py")


def code_blocks(text: str) -> list[str]:
    """The shell blocks' text (a block of another language is passed over whole, not paired with the next)."""
    return [body for lang, body in re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S) if lang in ("bash", "sh", "")]


def train_commands(page: Path) -> list[str]:
    """The page's train.py commands, continuation lines joined."""
    found = []
    for block in code_blocks(page.read_text()):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [line.strip() for line in joined.splitlines() if line.strip().startswith(STARTS)]
    return found


def commands() -> list[tuple[str, str]]:
    return [(page.relative_to(ROOT).as_posix(), cmd) for page in PAGES for cmd in train_commands(page)]


def test_the_manual_has_train_commands():
    pages = {page for page, _ in commands()}
    assert {"README.md", "docs/training.md"} <= pages, pages


def parse(command: str) -> None:
    """train.py's parser on the command's flags (argparse exits on an unknown flag or a bad value)."""
    words = shlex.split(command.split(" # ")[0])
    words = words[3:] if words[1] == "-m" else words[2:]
    words = [w for w in words if w != "${MODEL_ARGS[@]}"]  # the model shape, checked against config.json
    own, _ = split_vllm_args(words)
    build_parser().parse_args(own)


@pytest.mark.parametrize("page,command", commands(), ids=[f"{p}#{i}" for i, (p, _) in enumerate(commands())])
def test_every_train_command_in_the_manual_parses(page, command):
    try:
        parse(command)
    except SystemExit as err:
        pytest.fail(f"{page}: train.py's parser refused {command!r} (exit {err.code})")


def test_a_flag_that_no_longer_exists_is_caught():
    _, command = commands()[0]
    with pytest.raises(SystemExit):
        parse(command + " --rollout-batch-sise 4")

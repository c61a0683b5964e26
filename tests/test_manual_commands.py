"""Every command line in the manual (README.md, docs/, the examples' READMEs) that runs one of this project's
Python entry points goes through that program's own argument parser, so that a renamed or removed flag cannot
leave a command a user copies broken: ``train.py`` lines through train.py's parser, every other ``python -m
MODULE`` or ``python tools/X.py`` line through its module's argparse parser (run up to the parse and stopped
there, nothing executed after it)."""

import argparse
import os
import re
import runpy
import shlex
import sys
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


# Commands of the manual that are no entry point of this project's: the venv, the test runner.
NOT_OURS = ("python3 -m venv", "python -m pytest")


def python_commands() -> list[tuple[str, str]]:
    """The manual's other ``python`` commands (``VAR=value`` prefixes and ``&&`` chains split off)."""
    found = []
    for page in PAGES:
        for block in code_blocks(page.read_text()):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                for part in line.split("&&"):
                    part = re.sub(r"^(\S+=\S+ )+", "", part.strip())
                    if part.startswith("python") and not part.startswith(NOT_OURS) and "train.py" not in part \
                            and "vime_ext.train " not in part:
                        found.append((page.relative_to(ROOT).as_posix(), part))
    return found


class Parsed(Exception):
    pass


def parse_only(command: str, monkeypatch) -> None:
    """Run the command's program up to its argument parsing, then stop (``Parsed``); argparse's own exit on a bad
    flag propagates. Optional parts written ``[--flag X]`` are taken, a choice written ``a|b`` as its first."""
    words = shlex.split(command.split(" # ")[0].replace("[", " ").replace("]", " "))
    words = [w.split("|")[0] if "|" in w and not w.startswith("-") else w for w in words]
    real_parse, real_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []  # parse_args calls parse_known_args, then refuses what is left over: stop only after that

    def parse_args(self, args=None, namespace=None):
        inside.append(1)
        real_parse(self, args, namespace)
        raise Parsed

    def parse_known_args(self, args=None, namespace=None):
        result = real_known(self, args, namespace)
        if inside:
            return result
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_args)
    environment = dict(os.environ)  # the converters hide the GPUs at import; the other tests must not inherit it
    try:
        if words[1] == "-m":
            monkeypatch.setattr(sys, "argv", [words[2], *words[3:]])
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        else:
            monkeypatch.setattr(sys, "argv", words[1:])
            runpy.run_path(str(ROOT / words[1]), run_name="__main__")
    finally:
        os.environ.clear()
        os.environ.update(environment)


@pytest.mark.parametrize("page,command", python_commands(),
                         ids=[f"{p}#{i}" for i, (p, _) in enumerate(python_commands())])
def test_every_python_command_in_the_manual_parses(page, command, monkeypatch):
    with pytest.raises(Parsed):
        try:
            parse_only(command, monkeypatch)
        except SystemExit as err:
            pytest.fail(f"{page}: its parser refused {command!r} (exit {err.code})")


def test_a_command_with_a_flag_its_program_lacks_is_caught(monkeypatch):
    with pytest.raises(SystemExit):
        parse_only("python -m examples.mem_agent.hotpotqa_dev --out-dir /tmp/x --no-such-flag", monkeypatch)

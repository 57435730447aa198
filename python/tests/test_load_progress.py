"""--progress: weight loading reports "BATON_PROGRESS <done> <total>" lines on stderr."""

from pathlib import Path

import torch

from baton_worker.model.weights import WeightReader, stderr_progress
from baton_worker.runtime.options import parse_options

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "demo"


def test_progress_flag_parses():
    base = ["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "16"]
    assert parse_options(base).progress is False
    assert parse_options(base + ["--progress"]).progress is True


def test_reader_reports_monotonic_progress_ending_at_total():
    seen: list[tuple[int, int]] = []
    reader = WeightReader(DEMO, torch.float32, torch.device("cpu"), lambda d, t: seen.append((d, t)))
    names = list(reader.files)
    for name in names[: len(names) // 2]:
        reader.get(name)
    reader.close()
    total = len(names)
    assert all(t == total for _, t in seen)
    dones = [d for d, _ in seen]
    assert dones == sorted(dones)
    assert dones[-1] == total and max(dones[:-1]) < total


def test_stderr_lines_only_when_percent_changes(capsys):
    report = stderr_progress()
    for done in range(0, 1001):
        report(done, 1000)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 101
    assert lines[0] == "BATON_PROGRESS 0 1000" and lines[-1] == "BATON_PROGRESS 1000 1000"

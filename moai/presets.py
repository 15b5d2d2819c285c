"""Named presets: functions that return a `PipelineConfig`.

`tiny` is the embedded default that `python flows/pretrain.py` runs: the small corpus shipped in
`moai/assets/tiny.jsonl` (English, Korean, code), a 2,048-token byte-level BPE trained from it,
and 128-token packed samples. It runs on a laptop CPU in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from moai.config import PipelineConfig

ASSETS = Path(__file__).resolve().parent / "assets"


def tiny(cache_dir: str = ".moai") -> PipelineConfig:
    return PipelineConfig.model_validate({
        "cache_dir": cache_dir,
        "source": {"path": str(ASSETS / "tiny.jsonl"), "text_field": "text"},
        "filter": {"min_chars": 1},
        "tokenizer": {"train": {"vocab_size": 2048}},
        "pack": {"enabled": True, "seq_len": 128},
        "split": {"val_fraction": 0.05},
    })


PRESETS: dict[str, Callable[[], PipelineConfig]] = {"tiny": tiny}

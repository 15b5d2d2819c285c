"""Named presets: functions that return a `PipelineConfig`, and `resolve_config` (a file or a name).

`tiny` is the embedded default that `python flows/pretrain.py` runs: the small corpus shipped in
`moai/assets/tiny.jsonl` (English, Korean, code), a 2,048-token byte-level BPE trained from it,
128-token packed samples, and a 2-layer Llama trained on them for 40 steps. It runs on a laptop
CPU in well under a minute.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path

from moai.config import PipelineConfig, load_config
from moai.errors import ConfigError

ASSETS = Path(__file__).resolve().parent / "assets"


# A 2-layer Llama small enough to train for a few dozen steps on a laptop CPU in seconds.
TINY_LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


def tiny(cache_dir: str = ".moai") -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "cache_dir": cache_dir,
            "source": {"path": str(ASSETS / "tiny.jsonl"), "text_field": "text"},
            "filter": {"min_chars": 1},
            "tokenizer": {"train": {"vocab_size": 2048}},
            "pack": {"enabled": True, "seq_len": 128},
            "split": {"val_fraction": 0.05},
            "train": {
                "model_config": TINY_LLAMA,
                "output_dir": str(Path(cache_dir) / "runs" / "tiny"),
                "max_steps": 40,
                "micro_batch_size": 8,
                "lr": 3e-3,
                "warmup_steps": 4,
                "log_every": 5,
                "save_every": 20,
                "eval_batches": 4,
            },
        }
    )


PRESETS: dict[str, Callable[[], PipelineConfig]] = {"tiny": tiny}


def resolve_config(spec: str) -> PipelineConfig:
    """A config file path, or the name of a preset (`tiny`)."""
    if Path(spec).is_file():
        return _remember(load_config(spec), str(Path(spec).resolve()))
    if spec in PRESETS:
        return _remember(PRESETS[spec](), f"preset {spec}")
    raise ConfigError(f"{spec}: neither a config file nor a preset (presets: {', '.join(sorted(PRESETS))})")


# Where each config from `resolve_config` came from (its file, or `preset <name>`), for the use log
# the store keeps (`moai cache list`). Kept beside the config, not in it: it is not a setting, and
# two configs with the same settings stay equal.
_ORIGINS: dict[int, str] = {}


def _remember(config: PipelineConfig, origin: str) -> PipelineConfig:
    _ORIGINS[id(config)] = origin
    weakref.finalize(config, _ORIGINS.pop, id(config), None)
    return config


def config_origin(config: PipelineConfig) -> str | None:
    """The config file or preset `config` was resolved from; None for one built another way."""
    return _ORIGINS.get(id(config))

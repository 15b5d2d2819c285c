"""The model, its optimizer and schedule, and the FLOPs a token costs.

`build_model` makes a transformers causal LM from `train.model_config` (random init, fp32
weights: 4 bytes a parameter) or loads `train.init_from`; `build_optimizer` makes AdamW (two
more fp32 copies of the weights) with a cosine schedule. `flops_per_token` and `peak_flops` are
arithmetic, for the MFU in each metrics line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from moai import hub
from moai.config import ConfigError, TrainConfig

# Dense bf16 peak FLOP/s by GPU name (PaLM/torchtitan MFU convention).
PEAK_BF16 = [
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("A10G", 125e12),
    ("4090", 165e12),
]


def attention_kind(t: TrainConfig, cuda: bool, packed: bool) -> str:
    """Packed rows carry document boundaries in position_ids; with SDPA, transformers turns them
    into a block-diagonal mask and SDPA loses its flash kernel (1.1B Llama on an H100: 40% MFU),
    while flex_attention keeps document masking at near-flash speed (47%)."""
    if t.attn_implementation:
        return t.attn_implementation
    return "flex_attention" if cuda and packed else "sdpa"


def model_config_dict(t: TrainConfig) -> tuple[str, dict[str, Any] | None]:
    """The setting the model's config comes from and that config as a plain dict, read without
    transformers (importing it takes seconds): the inline dict, a config.json (a file, a folder's,
    or a hub name's cached copy), or init_from's. None when a hub name's config is not cached.
    A path that does not exist, an unreachable hub name or a file that is not JSON: `ConfigError`."""
    if t.mode == "continue":
        assert t.init_from is not None  # TrainConfig requires it in mode continue
        setting, value = "train.init_from", t.init_from
    elif isinstance(t.model, dict):
        return "train.model_config", dict(t.model)
    else:
        assert t.model is not None  # TrainConfig requires model_config in mode pretrain
        setting, value = "train.model_config", t.model
    src = hub.resolve(setting, value)
    if src.path is None:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(value, "config.json")
        return setting, _read_json(setting, Path(cached)) if isinstance(cached, str) else None
    file = src.path / "config.json" if src.path.is_dir() else src.path
    if not file.is_file():
        raise ConfigError(
            f"{setting} {value}: no config.json in that folder; give a save_pretrained folder or a config.json file"
        )
    return setting, _read_json(setting, file)


def _read_json(setting: str, file: Path) -> dict[str, Any]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{setting} {file}: cannot read it as a JSON model config: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{setting} {file}: a model config is a JSON object, not {type(data).__name__}")
    return data


def build_model(t: TrainConfig, vocab_size: int, tokenizer, attn: str = "sdpa"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if t.mode == "continue":
        assert t.init_from is not None  # TrainConfig requires it in mode continue
        src = hub.resolve("train.init_from", t.init_from)
        model = AutoModelForCausalLM.from_pretrained(
            src.name_or_path, attn_implementation=attn, dtype=torch.float32, local_files_only=src.local_files_only
        )
        if model.config.vocab_size < vocab_size:
            raise ConfigError(
                f"train.init_from {t.init_from}: vocab {model.config.vocab_size} < tokenizer's {vocab_size}"
            )
        return model
    assert t.model is not None  # TrainConfig requires model_config in mode pretrain
    if isinstance(t.model, str):
        src = hub.resolve("train.model_config", t.model)
        cfg = AutoConfig.from_pretrained(src.name_or_path, local_files_only=src.local_files_only)
    else:
        spec = dict(t.model)
        model_type = spec.pop("model_type", None)
        if model_type is None:
            raise ConfigError("train.model_config needs model_type (llama, qwen2, qwen3, ...)")
        cfg = AutoConfig.for_model(model_type, **spec)
    cfg.vocab_size = vocab_size
    for name in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(cfg, name, getattr(tokenizer, name, None))
    cfg.use_cache = False
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)


def build_optimizer(model, t: TrainConfig):
    """AdamW (fused on CUDA), no weight decay on biases and norms (the 1-D parameters), and its
    cosine schedule with warm-up."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    fused = {"fused": True} if torch.cuda.is_available() else {}
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=t.lr,
        betas=(0.9, 0.95),
        **fused,
    )
    return optimizer, cosine_with_warmup(optimizer, t)


def cosine_with_warmup(optimizer, t: TrainConfig):
    import torch

    def factor(step: int) -> float:
        if step < t.warmup_steps:
            return (step + 1) / (t.warmup_steps + 1)
        progress = (step - t.warmup_steps) / max(1, t.max_steps - t.warmup_steps)
        return t.min_lr_ratio + (1 - t.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def flops_per_token(model_config, num_params: int, seq_len: int) -> float:
    """PaLM: 6·N(non-embedding) + 12·L·H·Q·T."""
    c = model_config
    embed = c.vocab_size * c.hidden_size * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return 6 * (num_params - embed) + 12 * c.num_hidden_layers * heads * head_dim * seq_len


def peak_flops(device_name: str | None) -> float | None:
    if not device_name:
        return None
    for key, value in PEAK_BF16:
        if key in device_name:
            return value
    return None

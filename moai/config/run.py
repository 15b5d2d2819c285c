"""How the run runs: the training step, explicit resources, and where the flow's units run."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, WithJsonSchema, model_validator

from moai.config.base import _Model


class TrainConfig(_Model):
    """The training step: what model, how long, how fast, where checkpoints go."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, protected_namespaces=())

    enabled: bool = Field(True, description="Train after the data stages (false: prepare data only).")
    mode: Literal["pretrain", "continue"] = Field(
        "pretrain", description="pretrain: random init from model_config; continue: weights from init_from."
    )
    # The JSON schema says no type: Prefect's run form cannot draw an anyOf of a string and an object
    # (docs/FIELD-NOTES.md) and draws a property without a type as a JSON box, which takes both a
    # "path/config.json" string and an inline {...} dict. Validation is unchanged.
    model: Annotated[str | dict[str, Any] | None, WithJsonSchema({})] = Field(
        None,
        alias="model_config",
        description="A transformers config.json path (a JSON string) or an inline dict with model_type "
        "(llama, qwen2, qwen3, ...).",
    )
    init_from: str | None = Field(None, description="A save_pretrained folder to continue from (mode: continue).")
    output_dir: str = "runs/moai"
    max_steps: int = Field(100, ge=1)
    micro_batch_size: int = Field(8, ge=1)
    grad_accum_steps: int = Field(1, ge=1)
    lr: float = Field(3e-4, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine schedule floor, as a fraction of lr.")
    warmup_steps: int = Field(10, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    max_grad_norm: float = Field(1.0, gt=0)
    seed: int = 0
    save_every: int = Field(100, ge=1)
    keep_last: int = Field(2, ge=1)
    eval_every: int = Field(0, ge=0, description="Evaluate every N steps (0: only at the end).")
    eval_batches: int = Field(20, ge=1)
    log_every: int = Field(10, ge=1)
    stop_after_steps: int | None = Field(
        None, ge=1, description="End this invocation after N steps (checkpoint saved); a rerun resumes."
    )
    num_processes: int | None = Field(None, ge=1, description="Processes per machine (None: one per GPU, or 1).")
    mixed_precision: Literal["no", "bf16", "fp16"] | None = Field(None, description="None: bf16 on a GPU that has it.")
    compile: bool = False
    attn_implementation: str | None = Field(
        None, description="None: flex_attention on CUDA with packed rows (document masking at flash speed), else sdpa."
    )
    tracker: Literal["tensorboard", "mlflow", "wandb", "none"] = Field(
        "tensorboard",
        description="Where metrics go besides metrics.jsonl (mlflow, wandb: pip install 'moai[track]'); "
        "a step reaches it once its checkpoint is written.",
    )
    tracker_project: str = Field("moai", description="The MLflow experiment or W&B project of the run.")
    num_machines: int = Field(1, ge=1)
    machine_rank: int = Field(0, ge=0)
    main_process_ip: str | None = None
    main_process_port: int | None = Field(None, ge=1, le=65535)
    accelerate_config: str | None = Field(None, description="An accelerate config file (FSDP, DeepSpeed, ...).")

    @model_validator(mode="after")
    def _mode_needs_source(self) -> TrainConfig:
        if self.mode == "pretrain" and self.model is None:
            raise ValueError("train.mode pretrain needs train.model_config (a config.json path or dict)")
        if self.mode == "continue" and self.init_from is None:
            raise ValueError("train.mode continue needs train.init_from (a save_pretrained folder)")
        if self.machine_rank >= self.num_machines:
            raise ValueError(f"train.machine_rank {self.machine_rank} must be < train.num_machines {self.num_machines}")
        if self.num_machines > 1 and not self.main_process_ip:
            raise ValueError("train.num_machines > 1 needs train.main_process_ip")
        return self


class ResourcesConfig(_Model):
    """Explicit resource settings; each one left at None is decided by the hardware plan."""

    num_proc: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    writer_batch_size: int | None = Field(None, ge=1)
    loader_workers: int | None = Field(None, ge=0)
    mem_budget_gb: float | None = Field(None, gt=0)
    convert_workers: int | None = Field(
        None, ge=1, description="Processes parsing large JSON-lines files in convert (None: one per core)."
    )


class RunnerConfig(_Model):
    """Where the flow runs the tokenize and dedup signature units: in the flow's process, on a
    Dask cluster, or on Ray (`pip install 'moai[ray]'`)."""

    kind: Literal["local", "dask", "ray"] = "local"
    address: str | None = Field(
        None,
        description="dask: tcp://scheduler:8786 of an existing cluster; ray: auto or ray://head:10001 "
        "(None: a local cluster on loopback).",
    )
    n_workers: int | None = Field(
        None, ge=1, description="Local cluster workers (Dask processes, Ray CPUs; None: one per 2 cores)."
    )
    num_shards: int | None = Field(None, ge=1, description="Tokenize units (None: 4 per worker).")

    @model_validator(mode="after")
    def _ray_address(self) -> RunnerConfig:
        a = self.address
        if self.kind == "ray" and a is not None and a != "auto" and not a.startswith("ray://") and "://" in a:
            raise ValueError(f"runner.address {a!r} for kind ray: give auto, ray://head:10001 or head:6379")
        return self

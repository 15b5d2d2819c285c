"""Is a setting a local path or a Hugging Face hub name, and can it be had? Decided in seconds.

`tokenizer.path`, `train.model_config` (a string), `train.init_from` and `source.hub` each take a
local path or a hub name. Left to transformers or datasets, a path that does not exist is taken
for a hub name, and an offline machine spends 30–50 s in HTTP retries before saying it could not
reach huggingface.co, never that the folder is missing. `resolve` decides first, before any data
is read:

- a value that looks like a path (starts with `.`, `/` or `~`, ends with `.json`, or has a `/`
  whose first part exists here) must exist: else `ConfigError` naming the setting, the path and
  the working directory it is relative to;
- an existing path is local;
- a hub name is found in the local Hugging Face cache, or huggingface.co answers one request
  (`PROBE_TIMEOUT_S`, no retries; the answer is kept for the process), or it is one
  `ConfigError` line with a fix that works offline.

A hub name found in the cache while the hub is unreachable resolves as `"cache"`: loaders then
pass `local_files_only=True`, so they do not retry the network either.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from moai.errors import ConfigError

PROBE_TIMEOUT_S = 3.0
UNREACHABLE = "not in the local Hugging Face cache and huggingface.co is unreachable"

RepoType = Literal["model", "dataset"]
# A hub repo id: `name` or `owner/name`, letters, digits, `-`, `_`, `.` (no `--` or `..`).
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")

# What each setting expects locally, for the "no such ..." message.
EXPECTS = {
    "tokenizer.path": ("folder", "give the folder that holds tokenizer.json, or a hub model name (e.g. gpt2)"),
    "train.model_config": (
        "file",
        "give an existing config.json (or an inline dict with model_type), or a hub model name",
    ),
    "train.init_from": ("folder", "give a save_pretrained folder (with config.json), or a hub model name"),
}


@dataclass(frozen=True)
class Resolved:
    """Where a setting's value comes from: `local` (a path here), `cache` (a hub name in the local
    cache, hub unreachable: load with local_files_only), or `hub` (a hub name the hub answers for)."""

    setting: str
    value: str
    where: Literal["local", "cache", "hub"]
    path: Path | None = None

    @property
    def local_files_only(self) -> bool:
        return self.where == "cache"

    @property
    def name_or_path(self) -> str:
        return str(self.path) if self.path is not None else self.value


def looks_like_path(value: str) -> bool:
    """A value meant as a path, not a hub name (pure but for one `exists` on its first part)."""
    if value.startswith((".", "/", "~")) or value.lower().endswith((".json", ".yaml", ".yml")):
        return True
    if os.sep in value or "/" in value:
        first = value.replace(os.sep, "/").split("/")[0]
        return Path(first).exists() or not _REPO_ID.match(value)
    return False


def resolve(setting: str, value: str, repo_type: RepoType = "model", fix: str | None = None) -> Resolved:
    """Local path or reachable hub name, or a `ConfigError` within `PROBE_TIMEOUT_S` seconds; `fix`
    replaces the default advice for a hub name that cannot be had."""
    path = Path(value).expanduser()
    if path.exists():
        return Resolved(setting, value, "local", path)
    if setting == "source.hub":
        if not _REPO_ID.match(value):
            raise ConfigError(
                f"source.hub {value!r} is not a hub dataset name (owner/name); for local files set source.path"
            )
    elif looks_like_path(value):
        kind, hint = EXPECTS.get(setting, ("file or folder", "give an existing path"))
        raise ConfigError(f"{setting} {value}: no such {kind} (relative to {Path.cwd()}); {hint}")
    cached = in_cache(value, repo_type)
    offline = _offline_env()
    if not offline:
        status = probe(value, repo_type)
        if status is not None and status in (401, 404) and not cached:
            raise ConfigError(
                f"{setting} {value}: {_no_folder(setting, value)}no such {repo_type} on huggingface.co (or it is "
                f"private or gated: log in with `hf auth login`); {fix or _fix(setting, value)}"
            )
        if status is not None:
            return Resolved(setting, value, "hub")
    if cached:
        return Resolved(setting, value, "cache")
    why = "HF_HUB_OFFLINE is set" if offline else "huggingface.co is unreachable"
    raise ConfigError(
        f"{setting} {value}: {_no_folder(setting, value)}not in the local Hugging Face cache and {why}; "
        f"{'point it at an existing folder, or ' if _no_folder(setting, value) else ''}{fix or _fix(setting, value)}"
    )


def _no_folder(setting: str, value: str) -> str:
    """`owner/name` may have been meant as a folder: say first that there is none."""
    if setting == "source.hub" or "/" not in value:
        return ""
    kind = EXPECTS.get(setting, ("path", ""))[0]
    return f"no such {kind} (relative to {Path.cwd()}), and as a hub name it is "


def dataset_fix(name: str, subset: str | None = None, split: str = "train") -> str:
    """A command that saves a hub dataset split as JSON Lines (with `split=`, `load_dataset` returns a
    `Dataset`, which has `to_json`; without it a `DatasetDict`, which does not)."""
    args = ", ".join(repr(a) for a in (name, subset) if a is not None)
    out = f"{name.split('/')[-1]}.jsonl"
    return (
        f'python -c "from datasets import load_dataset; load_dataset({args}, split={split!r}).to_json({out!r})"'
        f" on a machine with network, copy {out} here and set source.path: {out} instead of source.hub"
    )


def _fix(setting: str, value: str) -> str:
    if setting == "source.hub":
        return f"run {dataset_fix(value)}"
    folder = value.split("/")[-1]
    auto, then = {
        "tokenizer.path": ("AutoTokenizer", folder),
        "train.model_config": ("AutoConfig", f"{folder}/config.json"),
        "train.init_from": ("AutoModelForCausalLM", folder),
    }.get(setting, ("AutoConfig", folder))
    code = f"from transformers import {auto}; {auto}.from_pretrained({value!r}).save_pretrained({folder!r})"
    return f'run python -c "{code}" on a machine with network, copy {folder}/ here and set {setting}: {then}'


def _offline_env() -> bool:
    from huggingface_hub import constants

    return bool(constants.is_offline_mode())


def _datasets_cache() -> Path:
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"])
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "datasets"


def in_cache(name: str, repo_type: RepoType = "model") -> bool:
    """Whether the local Hugging Face cache holds this repo: for a model, a cached config.json,
    tokenizer_config.json or tokenizer.json; for a dataset, its hub snapshot or a `datasets` build."""
    from huggingface_hub import constants, try_to_load_from_cache

    if repo_type == "model":
        files = ("config.json", "tokenizer_config.json", "tokenizer.json")
        return any(isinstance(try_to_load_from_cache(name, f, repo_type="model"), str) for f in files)
    snapshots = Path(constants.HF_HUB_CACHE) / f"datasets--{name.replace('/', '--')}" / "snapshots"
    if snapshots.is_dir() and any(snapshots.iterdir()):
        return True
    # `datasets` names its build folder owner___name_in_snake_case: compared without case or `_`.
    root = _datasets_cache()
    wanted = name.replace("/", "").replace("_", "").lower()
    return root.is_dir() and any(
        d.is_dir() and "___" in d.name and d.name.replace("_", "").lower() == wanted and any(d.iterdir())
        for d in root.iterdir()
    )


# Endpoints that did not answer in this process: an offline run pays the probe's timeout once.
_DOWN: set[str] = set()


def probe(name: str, repo_type: RepoType = "model") -> int | None:
    """The HTTP status of one HEAD of the repo's API page (None: the hub did not answer)."""
    from huggingface_hub import constants

    endpoint = constants.ENDPOINT.rstrip("/")
    if endpoint in _DOWN:
        return None
    kind = "models" if repo_type == "model" else "datasets"
    status = _head(f"{endpoint}/api/{kind}/{name}")
    if status is None:
        _DOWN.add(endpoint)
    return status


@functools.lru_cache(maxsize=32)
def _head(url: str) -> int | None:
    import httpx
    from huggingface_hub import get_token

    token = get_token()
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.head(url, timeout=PROBE_TIMEOUT_S, headers=headers, follow_redirects=True).status_code
    except (httpx.HTTPError, OSError):
        return None

"""The one-line result of a run (`summary`): the token store, the sample index, counts, and each
stage's report as the stage table and the JSON line show it."""

from __future__ import annotations

from typing import Any

from moai.pipeline.graph import StageResult, split_name
from moai.stages import mix, pack, tokenize


def summary(results: dict[str, StageResult]) -> dict[str, Any]:
    """The one-line result of a run: where the token store and sample index are, and counts. With
    several sources: `token_stores` by source (`token_store` is the first's), and the mix report
    under `mix`."""
    stores = {split_name(n)[1]: r for n, r in results.items() if split_name(n)[0] == tokenize.NAME}
    packed = results.get(pack.NAME) or results.get(mix.NAME)
    first = next(iter(stores.values()))
    out = {
        "token_store": first.path,
        "sample_index": packed.path if packed else None,
        "tokenizer": results["tokenizer"].path,
        "num_tokens": sum(r.report["tokens"] for r in stores.values()),
        "num_documents": sum(r.report["documents"] for r in stores.values()),
        "num_samples": packed.report["samples"] if packed else None,
        "stages": {
            name: {"key": r.key, "built": r.built}
            | {
                k: r.report[k]
                for k in (
                    "rows_in",
                    "rows_out",
                    "dropped",
                    "counts",
                    "tokens",
                    "samples",
                    "padding_fraction",
                    "documents_split",
                    "seconds",
                    "mb_per_s",
                    "warnings",
                )
                if k in r.report
            }
            | ({"repetition": _repetition(r.report)} if split_name(name)[0] == mix.NAME else {})
            for name, r in results.items()
        },
    }
    if mix.NAME in results:
        report = results[mix.NAME].report
        out["token_stores"] = {source: r.path for source, r in stores.items()}
        out["mix"] = {k: report[k] for k in ("total_tokens", "total_from", "tokens", "seq_len", "sources")}
    return out


def _repetition(mix_report: dict[str, Any]) -> dict[str, float]:
    """How many passes over its train windows each source gives (the mix report's `epochs`)."""
    return {s["name"]: s["epochs"] for s in mix_report.get("sources", [])}

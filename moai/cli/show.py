"""The commands that look and change nothing: plan (the resolved config, the hardware plan, the
checks), doctor (the set-up, pass/warn/fail with a fix) and trace (the documents a step trained on)."""

from __future__ import annotations

import argparse
import json
import os

from moai.config import read_env
from moai.errors import ConfigError
from moai.presets import resolve_config


def _plan_cmd(args: argparse.Namespace) -> int:
    from moai import preflight
    from moai.hardware import detect, plan

    config = resolve_config(args.config)
    checks = preflight.run(config)
    preflight.first_failure(checks)  # a mistake is the one `moai: error:` line, exit 2
    hw = detect(config.cache_dir)
    p = plan(hw, config, read_env())
    print("# resolved config")
    print(json.dumps(config.model_dump(mode="json", by_alias=True), indent=2))
    print("# hardware")
    print(json.dumps(p.to_dict()["hardware"], indent=2))
    print("# plan")
    width = max(len(r["setting"]) for r in p.rows())
    for r in p.rows():
        print(f"{r['setting']:<{width}}  {r['value']:<8}  {r['reason']}")
    print("# checks")
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(
            f"{c.status:<4}  {c.name:<{width}}  {c.detail}"
            + (f"; fix: {c.fix}" if c.status == "warn" and c.fix else "")
        )
    return 0


def _trace_cmd(args: argparse.Namespace) -> int:
    from moai.pipeline import prepare
    from moai.trace import Tracer, document_history, format_samples, sample_json, top_loss_steps

    config = resolve_config(args.config)
    if config.train is None:
        raise ConfigError(f"{args.config}: no train section: moai trace follows the samples training reads")
    if sum(x is not None for x in (args.step, args.top_loss, args.document)) != 1:
        raise ConfigError("moai trace: give one of --step N, --top-loss K or --document FILE:ROW")
    if args.document is not None:
        print(json.dumps(document_history(config, prepare(config, progress=False), args.document, args.world_size)))
        return 0
    if args.top_loss is not None:
        steps = top_loss_steps(os.path.join(config.train.output_dir, "metrics.jsonl"), args.top_loss, args.by)
    else:
        steps = [{"step": args.step}]
    tracer = Tracer(config, prepare(config, progress=False), args.world_size)  # None: each launch's, from metrics
    traced = [{**s, **tracer.step_record(s["step"], args.rank, args.micro_batch)} for s in steps]
    if args.json:
        print(json.dumps([{**t, "samples": [sample_json(x) for x in t["samples"]]} for t in traced]))
        return 0
    for t in traced:
        loss = f" (loss {t['loss']}, {t['jump']:+} over the 10 logged before)" if "loss" in t else ""
        lines = format_samples(t["step"], t["samples"])
        print(lines[0] + loss + f", world size {t['world_size']}")
        print("\n".join(lines[1:]))
    return 0


def _doctor_cmd(args: argparse.Namespace) -> int:
    from moai.doctor import evaluate, gather

    config = resolve_config(args.config) if args.config else None
    checks = evaluate(gather(config))
    marks = {"pass": "✔ pass", "warn": "! warn", "fail": "✘ fail"}
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"{marks[c.status]}  {c.name:<{width}}  {c.detail}")
        if c.fix and c.status != "pass":
            print(f"{'':8}  {'':<{width}}  fix: {c.fix}")
    failed = sum(c.status == "fail" for c in checks)
    print(
        f"{len(checks)} checks: {sum(c.status == 'pass' for c in checks)} pass, "
        f"{sum(c.status == 'warn' for c in checks)} warn, {failed} fail"
    )
    return 1 if failed else 0

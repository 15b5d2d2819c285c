"""What a terminal user sees of a finished run: one short line per stage.

`stage_table` is pure: it reads the `stages` part of `moai.pipeline.summary` (built or reused,
rows in → out, rows dropped by reason, the stage's own counts, seconds) and returns the lines the CLI prints on stderr,
so skipped and dropped rows are seen without opening a manifest.
"""

from __future__ import annotations

import time
from typing import Any


def timing(mb: float, started: float) -> dict[str, Any]:
    """A stage report's `mb_in`, `seconds` since `started` (a perf_counter) and `mb_per_s`: every
    text stage reports the megabytes of text (or source files) it read per second."""
    seconds = time.perf_counter() - started
    return {
        "mb_in": round(mb, 3),
        "seconds": round(seconds, 3),
        "mb_per_s": float(f"{mb / seconds:.3g}") if seconds > 0 else None,  # 3 significant digits, any size
    }


def throughput(mb_per_s: float) -> str:
    """MB/s with the precision its size needs: 103 MB/s, 2.5 MB/s, 0.66 MB/s, 0.0041 MB/s."""
    if mb_per_s >= 100:
        return f"{mb_per_s:,.0f} MB/s"
    if mb_per_s >= 1:
        return f"{mb_per_s:.1f} MB/s"
    return f"{mb_per_s:.2g} MB/s"


def _count(n: Any) -> str:
    return f"{n:,}" if isinstance(n, int) else "-"


def stage_table(stages: dict[str, dict[str, Any]]) -> list[str]:
    """One line per stage: name, built/reused, rows in → out, dropped by reason, seconds."""
    rows = []
    for name, s in stages.items():
        rows_io = f"{_count(s.get('rows_in'))} → {_count(s.get('rows_out'))}" if "rows_in" in s else ""
        if "repetition" in s:  # mix: the sources' train windows become samples, some used more than once
            rows_io = f"{_count(s.get('rows_in'))} windows → {_count(s.get('rows_out'))} samples"
        dropped = s.get("dropped") or {}
        dropped_text = ", ".join(f"{reason} {count:,}" for reason, count in sorted(dropped.items()))
        seconds = s.get("seconds")
        # A reused stage took no time now; its seconds are those of the build.
        when = "built" if s.get("built") else "reused"
        time_text = f"{seconds:.1f}s" if isinstance(seconds, (int, float)) else ""
        if not s.get("built") and time_text:
            time_text = f"(built in {time_text})"
        elif isinstance(s.get("mb_per_s"), (int, float)) and s["mb_per_s"] > 0:
            time_text += f"  {throughput(s['mb_per_s'])}"
        made = []
        if isinstance(s.get("tokens"), int) and name != "pack":
            made.append(f"{s['tokens']:,} tokens")
        if isinstance(s.get("samples"), dict):
            made.append("samples " + ", ".join(f"{split} {n:,}" for split, n in s["samples"].items()))
        if isinstance(s.get("padding_fraction"), (int, float)):
            made.append(f"padding {s['padding_fraction']:.3%}")
        if isinstance(s.get("documents_split"), int):
            made.append(f"{s['documents_split']:,} documents split")
        if isinstance(s.get("repetition"), dict):
            made.append("repetition " + ", ".join(f"{src} ×{r:.2f}" for src, r in s["repetition"].items()))
        if dropped_text:
            made.append(f"dropped: {dropped_text}")
        # a stage's own tallies, e.g. quality's and language's code_exempt (code kept without being judged)
        made.extend(f"{what} {n:,}" for what, n in sorted((s.get("counts") or {}).items()))
        rows.append((name, when, rows_io, "; ".join(made), time_text))
    widths = [max(len(r[i]) for r in rows) for i in range(4)] if rows else [0] * 4
    shown = [i for i in range(4) if widths[i]] + [4]  # a column empty in every row is left out
    return ["  ".join(r[i].ljust(widths[i]) if i < 4 else r[i] for i in shown).rstrip() for r in rows]

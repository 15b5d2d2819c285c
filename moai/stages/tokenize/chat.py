"""Chat data (`source.format: chat`): conversations rendered with a chat template, tokenized with
a per-token loss mask: 1 on each assistant turn's content and its end-of-turn token, 0 elsewhere.

convert keeps each conversation as the JSON of its `messages` list in the `text` column; this
module renders it and finds the assistant turns by rendering prefixes, which works for any
template, with or without `{% generation %}` (transformers' `return_assistant_tokens_mask` needs
that tag, and without it gives an all-zero or, in some wrappers, all-ones mask):

- P = render(messages[:i], add_generation_prompt=True) — everything before assistant turn i;
- Q = render(messages[:i + 1]) — the same with turn i: P must be a prefix of Q, Q of the whole
  conversation, and the turn's content must start where P ends (whitespace the template adds
  between them aside);
- the turn is its content (as the template renders it: trimmed if the template trims it) plus
  the template's end-of-turn token: the first special token after the content, inside Q.

The whole conversation is tokenized once with offsets (`add_special_tokens=False`: templates
write their own BOS), and a token is in the mask when its characters overlap a turn. EOS is
appended, as to every document of a token store, with mask 0. A template that breaks one of
these rules cannot mark assistant turns: `check_template` renders a probe conversation before
any data is tokenized and raises `ConfigError` naming the rule, never an all-ones mask; a
conversation that breaks one later (a template that rewrites earlier turns, such as one that
drops reasoning from past turns) is a `DataError` naming the document.

Cost: one render per assistant turn plus one for the conversation (Jinja, ~0.1 ms each on short
turns) and one encode with offsets, in one process: chat corpora are small next to pretraining
ones; tokenize-shard units do not take them (`units`).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from moai.config import ConfigError
from moai.errors import DataError
from moai.formats.tokens import STORE_FORMAT

log = logging.getLogger(__name__)

PROBE = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "Four."},
    {"role": "user", "content": "And three plus three?"},
    {"role": "assistant", "content": "Six, of course."},
]


def load_template(value: str | None) -> str | None:
    """`source.chat_template`: a path to a template file, or the template's text; None: the tokenizer's."""
    if value is None:
        return None
    if "{" not in value and Path(value).is_file():
        return Path(value).read_text(encoding="utf-8")
    if "{" not in value:
        raise ConfigError(f"source.chat_template {value!r}: no such file, and not a Jinja template (no '{{')")
    return value


class ChatTokenizer:
    """Renders and tokenizes conversations with their loss masks (see the module docstring)."""

    def __init__(self, tokenizer, template: str | None, eos_id: int):
        self.tok, self.eos_id = tokenizer, eos_id
        self.template = template if template is not None else getattr(tokenizer, "chat_template", None)
        if not self.template:
            raise ConfigError(
                "source.format chat: the tokenizer has no chat template; give one in source.chat_template "
                "(a Jinja template, or a path to one)"
            )
        specials = set(tokenizer.all_special_ids)
        specials |= {i for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False)}
        self.specials = specials

    def render(self, messages: list[dict[str, Any]], generation: bool = False) -> str:
        return self.tok.apply_chat_template(
            messages, chat_template=self.template, tokenize=False, add_generation_prompt=generation
        )

    def encode(
        self, messages: list[dict[str, Any]], where: str = "the probe conversation"
    ) -> tuple[list[int], list[int]]:
        """(ids, mask) of one conversation, EOS appended (mask 0); raises `ValueError` saying which rule broke."""
        full = self.render(messages)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            before, upto = self.render(messages[:i], generation=True), self.render(messages[: i + 1])
            if not upto.startswith(before) or not full.startswith(upto):
                raise ValueError(
                    f"{where}: rendering it turn by turn does not give prefixes of the whole (assistant turn {i}): "
                    "the template rewrites earlier turns"
                )
            content = m["content"]
            at = upto.find(content, len(before)) if content else len(before)
            if at < 0 and content.strip():  # templates that trim content (Llama 3's `| trim`)
                content = content.strip()
                at = upto.find(content, len(before))
            if at < 0 or upto[len(before) : at].strip():
                raise ValueError(
                    f"{where}: assistant turn {i}'s content is not where the generation prompt ends: "
                    "the template changes or moves assistant content"
                )
            end = at + len(content)
            eot = next(
                (
                    j
                    for j, (a, b) in enumerate(offsets)
                    if a >= end and b <= len(upto) and ids[j] in self.specials and b > a
                ),
                None,
            )
            if eot is None:
                raise ValueError(
                    f"{where}: assistant turn {i} ends with no special token (an end-of-turn token such as "
                    "<|im_end|> or </s>)"
                )
            spans.append((at, offsets[eot][1]))  # whitespace the template puts before the content is not trained
        if not spans:
            return [*ids, self.eos_id], [0] * (len(ids) + 1)
        starts = np.array([a for a, _ in offsets])
        ends = np.array([b for _, b in offsets])
        mask = np.zeros(len(ids), dtype=np.uint8)
        for lo, hi in spans:
            mask[(starts < hi) & (ends > lo)] = 1
        return [*ids, self.eos_id], [*mask.tolist(), 0]


def check_template(chat: ChatTokenizer) -> None:
    """Before tokenizing: the template marks a probe conversation's assistant turns exactly (with a
    system turn if the template takes one), or `ConfigError` naming what it cannot do."""
    probes = [PROBE, PROBE[1:]]
    last: Exception | None = None
    for probe in probes:
        try:
            ids, mask = chat.encode(probe)
        except ValueError as err:
            raise ConfigError(f"source.chat_template cannot mark assistant turns: {err}") from None
        except Exception as err:  # a template that refuses a system turn raises its own error
            last = err
            continue
        runs = masked_runs(ids, mask)
        texts = [chat.tok.decode(r) for r in runs]
        wanted = [m["content"] for m in probe if m["role"] == "assistant"]
        if len(texts) != len(wanted) or any(not t.lstrip().startswith(w) for t, w in zip(texts, wanted, strict=False)):
            raise ConfigError(
                f"source.chat_template cannot mark assistant turns: the masked tokens decode to {texts!r}, "
                f"not the assistant turns {wanted!r}"
            )
        if sum(mask) == len(mask) - 1:
            raise ConfigError("source.chat_template cannot mark assistant turns: every token would be trained on")
        return
    raise ConfigError(f"source.chat_template cannot render a conversation: {type(last).__name__}: {last}")


def masked_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The maximal runs of consecutive masked-in tokens (one per assistant turn)."""
    runs: list[list[int]] = []
    previous = 0
    for i, m in zip(ids, mask, strict=True):
        if m:
            if not previous:
                runs.append([])
            runs[-1].append(i)
        previous = m
    return runs


def messages_of(text: str, where: str) -> list[dict[str, Any]]:
    """The messages convert stored as JSON in the text column."""
    try:
        messages = json.loads(text)
    except ValueError as err:
        raise DataError(f"{where}: not a chat document (the text column holds no messages JSON: {err})") from None
    return messages


def tokenize_chat(
    tokenizer, template: str | None, eos_id: int, vocab_size: int, info: dict, text_dir: Path, out_dir: Path
) -> dict[str, Any]:
    """Write a token store with loss masks from the saved chat text: one part per split."""
    from datasets import load_from_disk

    from moai.stages.tokenize.parts import SPLITS, token_dtype, write_origins

    started = time.perf_counter()
    chat = ChatTokenizer(tokenizer, template, eos_id)
    check_template(chat)
    dtype = token_dtype(vocab_size)
    data = load_from_disk(str(text_dir))
    splits: dict[str, Any] = {}
    masked = total = 0
    for split in SPLITS:
        (out_dir / split).mkdir(parents=True, exist_ok=True)
        ids_all: list[int] = []
        mask_all: list[int] = []
        ends: list[int] = []
        texts = data[split]["text"] if split in data else []
        for n, text in enumerate(texts):
            where = f"{split} document {n}"
            try:
                ids, mask = chat.encode(messages_of(text, where), where)
            except ValueError as err:
                raise DataError(f"tokenize (chat): {err}") from None
            ids_all.extend(ids)
            mask_all.extend(mask)
            ends.append(len(ids_all))
        stem = f"{split}/part-00000"
        np.asarray(ids_all, dtype=dtype).tofile(out_dir / f"{stem}.bin")
        np.asarray(ends, dtype="<i8").tofile(out_dir / f"{stem}.idx")
        np.asarray(mask_all, dtype=np.uint8).tofile(out_dir / f"{stem}.mask")
        part = {"bin": f"{stem}.bin", "idx": f"{stem}.idx", "mask": f"{stem}.mask"}
        splits[split] = {
            "num_tokens": len(ids_all),
            "num_documents": len(ends),
            "parts": [{**part, "num_tokens": len(ids_all), "num_documents": len(ends)}],
        }
        masked += int(sum(mask_all))
        total += len(ids_all)
    meta = {
        "format": STORE_FORMAT,
        "dtype": dtype.str,
        "eos_id": eos_id,
        "vocab_size": vocab_size,
        **info,
        "loss_mask": True,
        "splits": splits,
    }
    (out_dir / "tokens.json").write_text(json.dumps(meta, indent=2))
    write_origins(text_dir, out_dir, [(s, 0, 0, splits[s]["num_documents"]) for s in SPLITS if s in data])
    docs = sum(s["num_documents"] for s in splits.values())
    seconds = time.perf_counter() - started
    return {
        "rows_in": docs,
        "rows_out": docs,
        "documents": docs,
        "tokens": total,
        "tokens_in_loss": masked,
        "fraction_in_loss": round(masked / total, 6) if total else 0.0,
        "splits": {k: {"documents": v["num_documents"], "tokens": v["num_tokens"]} for k, v in splits.items()},
        "engine": "transformers (chat template)",
        "seconds": round(seconds, 3),
    }

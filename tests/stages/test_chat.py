"""Chat data (`source.format: chat`): conversations rendered with a Qwen-style chat template on
Qwen's real tokenizer; the masked-in tokens decode to exactly the assistant turns, document by
document; training labels follow the mask in concat and best_fit packing; a template that cannot
mark assistant turns is refused before anything is tokenized; the shipped example runs."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

import real_tokenizers as rt
from conftest import ROOT, moai_cli, write_jsonl
from moai.config import ConfigError, parse_config
from moai.errors import DataError
from moai.formats.tokens import TokenStore
from moai.pipeline import prepare
from moai.stages.tokenize.chat import masked_runs

QWEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# No end-of-turn token after an assistant turn: nothing marks where it ends.
NO_END_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

BITS = [
    "한국어로 답합니다.",
    "def f(x):\n    return x * 2\n",
    "emoji 🙂🚀",
    "  spaced  out  ",
    "Line one\nLine two",
    "42",
]


def conversations(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": " ".join(rng.choices(BITS, k=rng.randint(1, 4)))})
            messages.append({"role": "assistant", "content": " ".join(rng.choices(BITS, k=rng.randint(1, 6)))})
        out.append({"id": i, "messages": messages})
    return out


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> Path:
    return rt.build("qwen", tmp_path_factory.mktemp("qwen") / "qwen")


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One cache for the module: the tokenizer stage (Qwen's 151k vocabulary) is built once."""
    return tmp_path_factory.mktemp("chat-cache")


def chat_config(cache: Path, corpus: Path, tokenizer: Path, template: str | None, **pack) -> dict:
    return {
        "cache_dir": str(cache),
        "source": {"path": str(corpus), "format": "chat", "chat_template": template},
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": 128, **pack},
        "split": {"val_fraction": 0.1},
    }


@pytest.mark.slow  # Qwen's 151k tokenizer: ~20 s
def test_masked_tokens_decode_to_exactly_the_assistant_turns(tmp_path, qwen, cache):
    from transformers import AutoTokenizer

    rows = conversations(200)
    corpus = write_jsonl(tmp_path / "chat.jsonl", rows)
    out = prepare(parse_config(chat_config(cache, corpus, qwen, QWEN_TEMPLATE)), progress=False)
    tok = AutoTokenizer.from_pretrained(qwen)
    store = TokenStore(out["token_store"])
    assert store.meta["loss_mask"] is True
    # each conversation rendered once by transformers itself: the document's text finds its messages
    by_text = {
        tok.apply_chat_template(r["messages"], chat_template=QWEN_TEMPLATE, tokenize=False): r["messages"] for r in rows
    }
    seen = 0
    for split in ("train", "validation"):
        tokens = store.split(split)
        assert tokens.has_loss_mask
        for i in range(tokens.num_documents):
            ids, mask = tokens.document(i).tolist(), tokens.loss_mask(i).tolist()
            assert len(ids) == len(mask) and ids[-1] == store.eos_id and mask[-1] == 0
            messages = by_text[tok.decode(ids[:-1])]
            wanted = [m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant"]
            assert [tok.decode(r) for r in masked_runs(ids, mask)] == wanted
            seen += 1
    assert seen == len(rows)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["concat", "best_fit"])
def test_training_labels_follow_the_mask(tmp_path, qwen, cache, mode):
    from moai.formats.tokens import PackedSamples
    from moai.train.data import PackedDataset

    corpus = write_jsonl(tmp_path / "chat.jsonl", conversations(120, seed=1))
    out = prepare(parse_config(chat_config(cache, corpus, qwen, QWEN_TEMPLATE, mode=mode)), progress=False)
    data, samples = PackedDataset(out["sample_index"], "train"), PackedSamples(out["sample_index"], "train")
    split = TokenStore(out["token_store"]).split("train")
    trained = 0
    for i in range(len(data)):
        item = data[i]
        if mode == "concat":
            _, start, length = samples.window(i)
            mask = split.loss_mask_tokens(start, start + length)
        else:
            row = samples.row(i)
            mask = np.concatenate([split.loss_mask_tokens(s, s + n) for _, s, n in row.tolist()])
            mask = np.concatenate([mask, np.zeros(samples.seq_len - len(mask), dtype=np.uint8)])
        labels, ids = item["labels"].numpy(), item["input_ids"].numpy()
        assert (labels[mask == 0] == -100).all() and (labels[mask == 1] == ids[mask == 1]).all()
        trained += int(mask.sum())
    assert 0 < trained < len(data) * samples.seq_len


@pytest.mark.slow  # Qwen's 151k tokenizer: ~20 s
def test_a_template_that_cannot_mark_assistant_turns_is_refused_before_tokenizing(tmp_path, qwen, cache):
    corpus = write_jsonl(tmp_path / "chat.jsonl", conversations(20))
    before = sorted(cache.glob("tokenize/*/tokens.json"))
    with pytest.raises(ConfigError, match=r"source\.chat_template cannot mark assistant turns: .* no special token"):
        prepare(parse_config(chat_config(cache, corpus, qwen, NO_END_TEMPLATE)), progress=False)
    # a template that drops assistant content
    drops = QWEN_TEMPLATE.replace(
        "message['content']", "(message['content'] if message['role'] != 'assistant' else 'ok')"
    )
    with pytest.raises(ConfigError, match="cannot mark assistant turns"):
        prepare(parse_config(chat_config(cache, corpus, qwen, drops)), progress=False)
    # the tokenizer has no template of its own and the config gives none
    with pytest.raises(ConfigError, match="the tokenizer has no chat template"):
        prepare(parse_config(chat_config(cache, corpus, qwen, None)), progress=False)
    assert sorted(cache.glob("tokenize/*/tokens.json")) == before  # nothing published by a refused template


def test_a_row_without_messages_is_a_bad_row(tmp_path, tokenizer_dir):
    corpus = write_jsonl(tmp_path / "chat.jsonl", [*conversations(5), {"messages": "hello"}])
    with pytest.raises(DataError, match="not a list of messages"):
        prepare(parse_config(chat_config(tmp_path, corpus, tokenizer_dir, QWEN_TEMPLATE)), progress=False)


@pytest.mark.slow
def test_the_chat_example_prepares(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    cfg = parse_config(
        json.loads(json.dumps(__import__("yaml").safe_load((ROOT / "examples" / "chat.yaml").read_text())))
    )
    assert cfg.source is not None and cfg.source.format == "chat"
    res = moai_cli("prepare", "examples/chat.yaml", "--no-progress", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    split = TokenStore(out["token_store"]).split("train")
    assert split.has_loss_mask and 0 < int(split.loss_mask_tokens(0, split.num_tokens).sum()) < split.num_tokens


def test_the_example_template_marks_each_assistant_turn_and_a_bad_one_is_named():
    from transformers import AutoTokenizer

    from moai.stages.tokenize.chat import ChatTokenizer, check_template, load_template

    tok = AutoTokenizer.from_pretrained(ROOT / "examples" / "tokenizer")
    chat = ChatTokenizer(tok, load_template(str(ROOT / "examples" / "chat" / "template.jinja")), tok.eos_token_id)
    check_template(chat)
    for line in (ROOT / "examples" / "chat" / "conversations.jsonl").read_text().splitlines()[:20]:
        messages = json.loads(line)["messages"]
        ids, mask = chat.encode(messages)
        wanted = [m["content"] + "<|endoftext|>" for m in messages if m["role"] == "assistant"]
        assert [tok.decode(r) for r in masked_runs(ids, mask)] == wanted
    with pytest.raises(ConfigError, match=r"^source.chat_template cannot mark assistant turns: .*no special token"):
        check_template(ChatTokenizer(tok, NO_END_TEMPLATE, tok.eos_token_id))
    with pytest.raises(ConfigError, match="no such file, and not a Jinja template"):
        load_template("templates/missing.jinja")


@pytest.mark.slow
def test_unpacked_batches_put_minus_100_where_the_mask_is_0(tmp_path, qwen, cache):
    from moai.train.data import DocumentDataset

    corpus = write_jsonl(tmp_path / "chat.jsonl", conversations(40, seed=2))
    raw = chat_config(cache, corpus, qwen, QWEN_TEMPLATE)
    raw["pack"]["enabled"] = False
    out = prepare(parse_config(raw), progress=False)
    data = DocumentDataset(out["token_store"], "train", seq_len=128, pad_id=0)
    split = TokenStore(out["token_store"]).split("train")
    ids = list(range(min(8, len(data))))
    batch = data.collate([data[i] for i in ids])
    for row, i in enumerate(ids):
        start, n = int(data.starts[i]), int(data.lengths[i])
        mask = split.loss_mask_tokens(start, start + n)
        labels = batch["labels"][row].numpy()
        assert (labels[:n][mask == 0] == -100).all() and (labels[n:] == -100).all()
        assert (labels[:n][mask == 1] == batch["input_ids"][row, :n].numpy()[mask == 1]).all()


def test_a_template_that_trims_content_and_spaces_it_marks_the_content_as_rendered():
    from transformers import AutoTokenizer

    from moai.stages.tokenize.chat import ChatTokenizer, check_template

    tok = AutoTokenizer.from_pretrained(ROOT / "examples" / "tokenizer")
    llama2ish = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] | trim + ' [/INST]' }}"
        "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] | trim + '<|endoftext|>' }}"
        "{% else %}{{ '<<SYS>>' + m['content'] + '<</SYS>>' }}{% endif %}{% endfor %}"
    )
    chat = ChatTokenizer(tok, llama2ish, tok.eos_token_id)
    check_template(chat)
    ids, mask = chat.encode([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  hello there  "}])
    assert [tok.decode(r) for r in masked_runs(ids, mask)] == ["hello there<|endoftext|>"]

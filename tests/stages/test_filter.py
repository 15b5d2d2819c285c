"""filter: what it says when nothing is left, and an empty input published by an older moai."""

import pytest

from moai.config import parse_config
from moai.errors import DataError
from moai.formats.text import write_text_dataset
from moai.stages.filter import filter_text


def filter_cfg(**kw):
    return parse_config({"source": {"path": "x"}, "tokenizer": {"path": "t"}, "filter": kw}).filter


def run_filter(tmp_path, texts, cfg):
    conv = tmp_path / "conv"
    conv.mkdir()
    write_text_dataset([texts] if texts else [], conv, "1MB")
    out = tmp_path / "filt"
    out.mkdir()
    return filter_text(cfg, conv, out, batch_size=4, max_shard_size="1MB")


@pytest.mark.parametrize(
    "texts, kw, counts, fix",
    [
        (["", " \n"], {}, "empty: 2", r"check that source\.text_field/text_template picks the text$"),
        (["ab", "", "abc"], {"min_chars": 5}, "empty: 1, too_short: 2", r"lower filter\.min_chars or check"),
        (["abcdef", "abcdefgh"], {"max_chars": 3}, "too_long: 2", r"raise filter\.max_chars$"),
    ],
)
def test_everything_filtered_out_names_counts_settings_and_fix(tmp_path, texts, kw, counts, fix):
    cfg = filter_cfg(**kw)
    with pytest.raises(
        DataError,
        match=rf"^filter: every one of {len(texts)} rows was filtered out \({counts}\) with "
        rf"filter\.min_chars={cfg.min_chars}, filter\.max_chars={cfg.max_chars}; .*{fix}",
    ):
        run_filter(tmp_path, texts, cfg)  # raised inside the build: the store publishes nothing


def test_an_empty_convert_output_from_an_older_moai_is_named(tmp_path):
    # convert no longer publishes an empty output, but an older moai did, as a folder without any
    # shard (today's writer gives an empty folder one empty shard); datasets cannot open that one
    # (IndexError in load_from_disk), so every rerun failed with a traceback.
    import json

    conv = tmp_path / "conv"
    conv.mkdir()
    write_text_dataset([], conv, "1MB")
    state = json.loads((conv / "state.json").read_text())
    for entry in state["_data_files"]:
        (conv / entry["filename"]).unlink()
    (conv / "state.json").write_text(json.dumps({**state, "_data_files": []}))
    (tmp_path / "filt").mkdir()
    with pytest.raises(
        DataError, match=rf"^filter: the convert output {tmp_path}/conv holds 0 documents .* remove it \(rm -rf "
    ):
        filter_text(filter_cfg(), conv, tmp_path / "filt", batch_size=4, max_shard_size="1MB")

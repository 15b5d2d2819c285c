"""The training datasets over a published sample index."""

import warnings

import yaml

from conftest import ROOT
from moai.config import parse_config
from moai.pipeline import prepare
from moai.train.data import PackedDataset


def test_chat_windows_mask_labels_without_warnings(tmp_path):
    """A concat window of a chat store carries its loss mask as a slice of the memory-mapped
    store: building the labels must not hand torch the read-only map (`The given NumPy array is
    not writable`)."""
    data = yaml.safe_load((ROOT / "examples" / "chat.yaml").read_text())
    data["source"]["path"] = str(ROOT / data["source"]["path"])
    data["source"]["chat_template"] = str(ROOT / data["source"]["chat_template"])
    data["tokenizer"]["path"] = str(ROOT / data["tokenizer"]["path"])
    data["cache_dir"] = str(tmp_path / "cache")
    data["pack"] = {"seq_len": 64, "mode": "concat"}
    del data["train"]
    dataset = PackedDataset(prepare(parse_config(data), progress=False)["sample_index"], "train")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        items = [dataset[i] for i in range(len(dataset))]
    assert any((it["labels"] == -100).any() for it in items) and any((it["labels"] != -100).any() for it in items)

"""One simulated rank reading moai WebDataset shards with 2 DataLoader workers; prints what it saw."""

import json
import sys

import torch

from moai.formats.webdataset import webdataset_loader

urls, seq_len, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
loader = torch.utils.data.DataLoader(
    webdataset_loader(urls, seq_len, dtype=dtype, shuffle_buffer=50), batch_size=None, num_workers=2
)
seen = {s["key"]: {"ids": s["input_ids"].tolist(), "pos": s["position_ids"].tolist()} for s in loader}
print(json.dumps(seen))

"""The on-disk contracts a user opens: the text stages' `save_to_disk` folders (`text`), the token
store and the sample index (`tokens`), and WebDataset shards of packed samples (`webdataset`)."""

"""Transitional: the WebDataset export and loader are in `moai.formats.webdataset`."""
# transitional re-export: remove when pipeline/cli/train import moai.formats
from moai.formats.webdataset import export_webdataset  # noqa: F401

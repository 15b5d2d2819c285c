"""Transitional: the tokenize stage's shard units are in `moai.stages.tokenize.units`."""
# transitional re-export: remove when pipeline/cli/train import moai.formats
from moai.stages.tokenize.units import merge, run_shard  # noqa: F401

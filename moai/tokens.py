"""Transitional: the token store and sample index readers are in `moai.formats.tokens`."""
# transitional re-export: remove when pipeline/cli/train import moai.formats
from moai.formats.tokens import PackedSamples, TokenStore  # noqa: F401

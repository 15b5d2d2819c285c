"""moai: from a raw text dataset to a trained checkpoint.

The library never imports Prefect; flows in `flows/` wrap its stage functions.
"""

__version__ = "0.1.0"

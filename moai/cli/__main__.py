"""`python -m moai.cli`: the `moai` command."""

import sys

from moai.cli import main

if __name__ == "__main__":
    sys.exit(main())

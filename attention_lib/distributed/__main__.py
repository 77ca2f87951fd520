"""``python -m attention_lib.distributed`` (under ``torchrun``): chapter 14's check.

See :func:`attention_lib.distributed.cases.main` and the README.
"""

import sys

from .cases import main

if __name__ == "__main__":
    sys.exit(main())

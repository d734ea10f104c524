"""``python -m prove.recipes.gpu_check`` (``make gpu-check``)."""

import sys

from prove.recipes.gpu_check.cli import main

sys.exit(main())

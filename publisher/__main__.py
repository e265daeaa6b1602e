"""``python -m publisher run --config FILE`` == ``txrepl publisher run --config FILE``."""

import sys

from common.cli import main

sys.exit(main(["publisher", *sys.argv[1:]]))

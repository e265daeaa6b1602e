"""``python -m subscriber run --config FILE`` == ``txrepl subscriber run --config FILE``."""

import sys

from common.cli import main

sys.exit(main(["subscriber", *sys.argv[1:]]))

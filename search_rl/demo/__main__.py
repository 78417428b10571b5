"""``python -m search_rl.demo``: the demo's command line (``cli.main``)."""

import sys

from search_rl.demo.cli import main

if __name__ == "__main__":
    sys.exit(main())

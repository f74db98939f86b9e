"""``python -m verl_pipe.bench [--quick] --out FILE.json [--charts DIR]``: the side-by-side benchmark (run.py)."""

import sys

from verl_pipe.bench.run import main

sys.exit(main())

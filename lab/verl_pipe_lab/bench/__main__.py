"""``python -m verl_pipe_lab.bench [--quick] --out FILE.json [--charts DIR]``: the side-by-side benchmark (run.py);
``python -m verl_pipe_lab.bench NAME [ARGS...]``: a named command (commands.py; ``--help`` lists them)."""

import sys

from verl_pipe_lab.bench.commands import chosen_command, run_command

_chosen = chosen_command(sys.argv[1:])
if _chosen is not None:  # before run.py's imports: a command needs only its own
    sys.exit(run_command(*_chosen))

from verl_pipe_lab.bench.run import main  # noqa: E402

sys.exit(main())

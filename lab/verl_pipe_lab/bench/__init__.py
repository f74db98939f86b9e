"""Side-by-side benchmark of the trainer's modes on the real stack (``python -m verl_pipe_lab.bench``).

run.py      the runner: settings x modes x rounds on one PipeSession, the result JSON, the command line
calib.py    calibrates the simulator (verl_pipe/sim) on the measured steps and re-simulates them (sim_validation)
report.py   per-mode summaries, the result schema and its check, plain-text tables
charts.py   group-completion CDFs, one-step timelines, the T/R sweep (matplotlib)
"""

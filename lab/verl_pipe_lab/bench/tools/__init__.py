"""Measurement scripts, each a command of ``python -m verl_pipe_lab.bench NAME`` (registered in ../commands.py): one-off
timings and checks that docs/ cites as the provenance of its figures. Each module's ``main(argv)`` is its command."""

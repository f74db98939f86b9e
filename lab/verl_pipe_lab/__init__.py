"""The lab beside the runtime (verl_pipe): the benchmark harness, verl's trainers run as peers, the learning
comparisons, the studies and their measurement scripts (``bench/``; ``python -m verl_pipe_lab.bench``).

A package of its own (lab/pyproject.toml, distribution ``verl-pipe-lab``): it imports the runtime; the runtime never
imports it (tests/test_layout.py), and the runtime's wheel ships none of it (tests/test_install.py).
"""

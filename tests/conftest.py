"""Shared test setup.

The CPU platform must be selected before anything imports verl, so the environment
of a CPU run is set here, at collection time. End-to-end tests share ONE live stack
(Ray cluster, vLLM engine, verl workers): the session-scoped ``pipe`` fixture.
"""

import os

from verl_pipe.platform.env import cpu_env

os.environ.setdefault("VERL_PIPE_CACHE", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".cache", "verl_pipe"))
for _k, _v in cpu_env("0", "1").items():
    os.environ.setdefault(_k, _v)

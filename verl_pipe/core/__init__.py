"""The pure cores: the decisions of a step as plain Python, no verl, vLLM, Ray, torch or asyncio.

Each module imports only the standard library, numpy and the other modules here (tests/test_layout.py keeps it so),
and is driven by thin adapters elsewhere in verl_pipe: the trainer and the rollout stream on the real stack,
the simulator (verl_pipe.sim) on a cost model.
"""

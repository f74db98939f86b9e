"""``python -m verl_pipe.doctor [--gpu] [--out DIR]``: the acceptance run of a new machine, one report.

Modules: ``checks`` (torch, the driver, the packages), ``versions`` (the pinned set), ``device`` (torch-only GPU
checks, run without vLLM, Ray or verl), ``theta`` (the θ_k store under FSDP2), ``stack`` (the tiny model on the real
stack, sync and pipelined, and their exactness on the same responses), ``report`` (JSON and a readable summary).
"""

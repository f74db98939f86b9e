"""The planner (python -m verl_pipe.plan): predicted step times per mode on a user's config, lengths and GPUs.

lengths.py    response-length sources (specs, verl rollout dumps, bench steps files, our steps.jsonl / traces,
              parquet)
hardware.py   GPU profiles and model shapes (dense and mixture of experts), every figure tagged measured /
              published / derived / assumed
runconfig.py  the composed run config -> the shape to simulate, or a refusal naming the key
calibrate.py  --calibrate RUN: the bench's fit on a real run's steps (a main_grpo trace_dir or a bench steps file);
              verl's own trainer fitted on verl's own spans
predict.py    the pure core: verl_pipe.sim on every mode, the sweeps, the recommendation and verdict
report.py     text table, JSON, chart
validate.py   predictions against every bench JSON in docs/bench (python -m verl_pipe.plan --validate)
public.py     published settings planned, assumptions written down (python -m verl_pipe.plan.public)
"""

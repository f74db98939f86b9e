"""How a step's requests reach the vLLM replicas and come back, one response at a time.

- ``client``: a verl ``LLMServerClient`` that sends each request to the replica the
  admission policy chose (and with its priority) instead of verl's load balancer.
- ``stream``: runs one step's requests through verl's own agent loop (tokenization,
  generation, padding, streamed reward), admitting them under an admission policy
  from ``verl_pipe.core.frontier`` and handing back every finished response.
- ``materialize``: turns a finished group's responses into a trainable DataProto
  piece (prompt rows, responses, rewards, group advantages from verl's core_algos).
"""

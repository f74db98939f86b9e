"""A rollout that replays recorded responses, at verl's agent-loop seam, for verl's own V1 trainer.

verl seam (verl 0.9.1): an agent loop registered by name through
``actor_rollout_ref.rollout.agent.agent_loop_config_path`` (a YAML list of ``{name, _target_, kwargs...}`` that every
``AgentLoopWorker`` loads; verl instantiates the class per request with the kwargs) and selected with
``actor_rollout_ref.rollout.agent.default_agent_loop``. ``ReplayAgentLoop`` is verl's ``SingleTurnAgentLoop`` (its
prompt tokenization, token merge and output, unchanged) whose LLM server is a replay: ``generate`` returns the
recorded response of (prompt, session) instead of asking vLLM. Everything after the response (the reward loop,
TransferQueue, the trainer's step) is verl's.

Row order: verl's V1 trainer trains a step's rows in the order they reach TransferQueue (the rollout's completion
order; its replay buffer materializes the batch in insertion order). A replayed row can also be made to complete in
a given ``position``: it returns only once every row before it is in TransferQueue. The test uses that to give verl
the rows in the order our trainer trains them (the order changes only the float summation order of the gradient,
and the padding of verl's fixed-size micro-batches).

``write_replay(rows, directory)`` writes the rows and the agent-loop YAML; ``replay_overrides(yaml)`` are the config
keys that select the replay. The rows may also come after verl has started (``replay_agent_loop(directory)`` first,
``write_rows`` later: a replayed request waits for them, ``cancel_replay`` ends the wait), so verl's start-up can
overlap the run that records them.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

REPLAY_AGENT = "verl_pipe_replay"
_ROWS: dict[str, dict] = {}  # replay file -> its rows, loaded once per agent-loop worker process


def row_key(index: Any, session: Any) -> tuple[str, int]:
    """(dataset index, session) as the recording and verl's agent loop both spell it (a tensor or numpy scalar in
    verl's batch, an int in ours)."""
    index = index.item() if hasattr(index, "item") else index
    return str(index), int(session.item() if hasattr(session, "item") else session)


ROWS_FILE, CANCEL_FILE = "replay_rows.pt", "replay_rows.cancelled"
WAIT_S = 1800.0  # how long a replayed request waits for rows written after verl started (write_rows)


def replay_agent_loop(directory: str | Path) -> Path:
    """Writes verl's agent-loop file naming the replay of ``directory``'s rows (``write_rows``, which may come later:
    a replayed request waits for them, so verl can start before the responses exist); returns its path (for
    ``replay_overrides``)."""
    directory = Path(directory)
    yaml_path = directory / "replay_agent_loops.yaml"
    yaml_path.write_text(f"- name: {REPLAY_AGENT}\n  _target_: {__name__}.ReplayAgentLoop\n"
                         f"  replay_path: {directory / ROWS_FILE}\n")
    return yaml_path


def write_rows(rows: list[dict], directory: str | Path) -> Path:
    """``rows``: one per response, each {"index" (the dataset row's ``index``), "session" (0..n-1 within its group),
    "prompt_ids", "response_ids", "rollout_log_probs" (or None), "version" (the weight version that generated it),
    "position" (the order it completes in, or None: as it comes)}. Written whole at once (a waiting replay never
    reads a partial file); returns the file's path."""
    import torch

    directory = Path(directory)
    by_key: dict = {}
    for r in rows:
        key = row_key(r["index"], r["session"])
        if key in by_key:
            raise ValueError(f"two recorded responses for dataset index {r['index']} session {r['session']}: "
                             "the replay needs each prompt once per step (a unique extra_info.index)")
        by_key[key] = {k: r.get(k) for k in ("prompt_ids", "response_ids", "rollout_log_probs", "version", "position")}
    data_path, partial = directory / ROWS_FILE, directory / (ROWS_FILE + ".partial")
    torch.save(by_key, partial)
    os.replace(partial, data_path)
    return data_path


def cancel_replay(directory: str | Path) -> None:
    """No rows will come: a waiting replayed request raises (verl's run then fails instead of waiting)."""
    (Path(directory) / CANCEL_FILE).touch()


def write_replay(rows: list[dict], directory: str | Path) -> Path:
    """``write_rows`` and ``replay_agent_loop``: returns the agent-loop file's path (for ``replay_overrides``)."""
    write_rows(rows, directory)
    return replay_agent_loop(directory)


def replay_overrides(agent_loop_yaml: str | Path) -> dict:
    """Config keys (dotted) that make verl's agent-loop workers replay (write_replay's file)."""
    return {"actor_rollout_ref.rollout.agent.agent_loop_config_path": str(agent_loop_yaml),
            "actor_rollout_ref.rollout.agent.default_agent_loop": REPLAY_AGENT}


async def _rows(path: str) -> dict:
    """The rows of ``path`` once written (write_rows), loaded once per process; waits up to WAIT_S for them."""
    if path not in _ROWS:
        import torch

        data, cancelled = Path(path), Path(path).with_name(CANCEL_FILE)
        deadline = time.monotonic() + WAIT_S
        while not data.exists():
            if cancelled.exists():
                raise RuntimeError(f"replay cancelled: no rows will be written to {path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replay rows at {path} after {WAIT_S:.0f} s")
            await asyncio.sleep(0.05)
        _ROWS[path] = torch.load(path, weights_only=False)
    return _ROWS[path]


async def _trajectories_in_queue(partition_id: str = "train") -> int:
    """Rows (not prompt markers) in verl's TransferQueue partition (keys ``{uid}_{session}_{index}``)."""
    import transfer_queue as tq

    listed = await tq.async_kv_list(partition_id)
    return sum(1 for tag in (listed or {}).get(partition_id, {}).values() if not tag.get("is_prompt", False))


class _ReplayServer:
    """Stands in for verl's LLMServerClient in one agent loop: ``generate`` returns the recorded response."""

    def __init__(self, row: dict, where: str):
        self.row, self.where = row, where

    async def generate(self, *, request_id, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        if list(prompt_ids) != list(self.row["prompt_ids"]):
            raise ValueError(f"{self.where}: verl's prompt tokens {list(prompt_ids)} are not the recorded "
                             f"{list(self.row['prompt_ids'])}")
        version = self.row.get("version")
        extra = {} if version is None else {"min_global_steps": int(version), "max_global_steps": int(version)}
        return TokenOutput(token_ids=list(self.row["response_ids"]), log_probs=self.row.get("rollout_log_probs"),
                           stop_reason="completed", num_preempted=0, extra_fields=extra)


def _agent_loop_base():
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    return SingleTurnAgentLoop


class ReplayAgentLoop(_agent_loop_base()):
    """verl's SingleTurnAgentLoop with the recorded response of (dataset index, session) as the LLM's output."""

    def __init__(self, *args, replay_path: str, name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.replay_path = str(replay_path)

    async def run(self, sampling_params: dict[str, Any], **kwargs):
        self.replay = await _rows(self.replay_path)
        key = row_key(kwargs.get("index"), kwargs["session_id"])
        if key not in self.replay:
            raise KeyError(f"no recorded response for dataset index {key[0]} session {key[1]}: verl's data order is "
                           "not the recorded step's")
        row = self.replay[key]
        self.server_manager = _ReplayServer(row, f"index {key[0]} session {key[1]}")
        output = await super().run(sampling_params, **kwargs)
        position = row.get("position")
        if position is not None:  # complete after every row before it is in TransferQueue
            while await _trajectories_in_queue() < int(position):
                await asyncio.sleep(0.005)
        return output

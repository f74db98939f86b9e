"""The Ray settings the launcher gives a long run (verl_pipe/launch/ray_start.py: RAY_ENV_DEFAULTS), pure: set where unset,
a user's own value kept."""

from verl_pipe.launch.ray_start import RAY_ENV_DEFAULTS, ray_env_defaults


def test_task_event_cap_and_metrics_off_are_set_unless_the_user_set_them():
    env = {}
    assert ray_env_defaults(env) == RAY_ENV_DEFAULTS == {"RAY_task_events_max_num_task_in_gcs": "10000",
                                                         "RAY_enable_metrics_collection": "0"}
    assert env == RAY_ENV_DEFAULTS
    mine = {"RAY_task_events_max_num_task_in_gcs": "500", "RAY_enable_metrics_collection": "1"}
    assert ray_env_defaults(dict(mine)) == {}
    partly = {"RAY_enable_metrics_collection": "1"}
    assert ray_env_defaults(partly) == {"RAY_task_events_max_num_task_in_gcs": "10000"}
    assert partly["RAY_enable_metrics_collection"] == "1"


def _launch_kwargs(extra_env: dict) -> dict:
    """ray_init_kwargs of the tiny CPU default, in a subprocess (it sets the CPU platform's environment)."""
    import json
    import os
    import subprocess
    import sys

    code = ("import json, os\nfrom verl_pipe.launch.ray_start import ray_init_kwargs\nfrom verl_pipe.launch.session import compose\n"
            "k = ray_init_kwargs(compose([]))\n"
            "print('RESULT' + json.dumps({'include_dashboard': k.get('include_dashboard'), "
            "'env_vars': k['runtime_env']['env_vars'], "
            "'mine': os.environ.get('VERL_DATAPROTO_SERIALIZATION_METHOD')}))")
    env = {k: v for k, v in os.environ.items() if k != "VERL_DATAPROTO_SERIALIZATION_METHOD"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, **extra_env}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(next(ln for ln in out.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT"):])


def test_cpu_launch_turns_off_the_dashboard_and_pickles_dataprotos_with_numpy_in_every_process():
    r = _launch_kwargs({})
    assert r["include_dashboard"] is False
    assert r["env_vars"]["VERL_DATAPROTO_SERIALIZATION_METHOD"] == "numpy" == r["mine"]  # workers and the driver
    own = _launch_kwargs({"VERL_DATAPROTO_SERIALIZATION_METHOD": "torch"})  # a launcher's own value is kept
    assert own["env_vars"]["VERL_DATAPROTO_SERIALIZATION_METHOD"] == "torch" == own["mine"]

"""The Ray settings the launcher gives a long run (verl_pipe/main_grpo.py: RAY_ENV_DEFAULTS), pure: set where unset,
a user's own value kept."""

from verl_pipe.main_grpo import RAY_ENV_DEFAULTS, ray_env_defaults


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

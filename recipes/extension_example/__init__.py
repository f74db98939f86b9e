"""Worked extension example for verl_pipe (docs/extending.md).

A RolloutPipeTrainer subclass that changes three things without copying verl_pipe's code:

- which complete groups are trained (``ExampleTrainer.group_is_trainable``),
- in which order groups are admitted to the rollout (``DeferringFrontierPolicy``, the recipe's
  ``rolloutpipe.fgd.policy``, with its arguments from ``ExampleTrainer.admission_kwargs``),
- the reward (``reward.compute_score``, selected with verl's ``reward.custom_reward_function``).

Run it with ``python -m verl_pipe.main_grpo --config-name tiny_cpu_extension_example`` from any directory,
installed or from a checkout (the modules are imported as ``verl_pipe.recipes.extension_example.*``, the way
``rolloutpipe.trainer_class`` and ``pkg://`` reward paths import them).
"""

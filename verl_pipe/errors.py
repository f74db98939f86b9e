"""The project's configuration error, importable without omegaconf (verl_pipe/config.py re-exports it; the GPU driver
check raises it on a torch-only machine too, under python -m verl_pipe.doctor)."""


class ConfigError(ValueError):
    """A bad setting, named in the message (``key: what is wrong``)."""

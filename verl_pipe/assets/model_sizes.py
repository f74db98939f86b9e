"""The tiny model's sizes (``rolloutpipe.tiny_assets.size``), apart from verl_pipe/assets/model.py so that the config
check reads them without importing torch and transformers."""

# head_dim 64 everywhere: vLLM's CPU attention backend rejects smaller heads.
MODEL_SIZES: dict[str, dict] = {
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=384,
    ),
    # Big enough that the trainer's share of a step is realistic in benchmarks (~13M params).
    "bench": dict(
        num_hidden_layers=4,
        hidden_size=512,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=1536,
    ),
}

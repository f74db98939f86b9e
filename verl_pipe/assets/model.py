"""A random-init Qwen3 saved like a hub checkpoint: verl and vLLM load model and tokenizer from one dir."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from verl_pipe.assets.model_sizes import MODEL_SIZES  # noqa: F401 -- the sizes build_config knows


def build_config(tokenizer: PreTrainedTokenizerBase, size: str = "tiny") -> Qwen3Config:
    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose from {sorted(MODEL_SIZES)}")
    return Qwen3Config(
        **MODEL_SIZES[size],
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # float32: bfloat16 matmuls are slower than float32 on these CPUs.
        dtype="float32",
        # Qwen3 has no BOS in its tokenizer and names <|endoftext|> as bos in the model config; we do the same.
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


# Average logit boost of the digit tokens at init (see _add_digit_prior).
DIGIT_PRIOR_LOGIT = 1.0


@torch.no_grad()
def _add_digit_prior(model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerBase, boost: float) -> None:
    """Make a random-init model say digits often enough for GRPO to have a signal.

    A random model picks any of ~1.5k tokens nearly uniformly, so a digit (the answer of
    our tasks) appears in well under 1% of samples, almost every group gets reward 0 and
    GRPO's group advantages are all zero. The final hidden states of a random Qwen3 share
    a mean direction m; adding boost·m/|m|² to the (tied) output rows of the digit tokens
    raises their logits by about ``boost`` on average, without touching anything else.
    """
    ids = tokenizer(["What is 3 + 4 modulo 10? Answer:", "the cat sat on the mat 12 34"],
                    return_tensors="pt", padding=True)
    hidden = model.model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).last_hidden_state
    mean = hidden[ids["attention_mask"].bool()].mean(dim=0)
    digits = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    model.get_output_embeddings().weight[digits] += boost * mean / mean.dot(mean)


def build_model(out_dir: Path, tokenizer: PreTrainedTokenizerBase, size: str = "tiny", seed: int = 0) -> Path:
    out_dir = Path(out_dir)
    config = build_config(tokenizer, size)
    # fork_rng: seed the init without disturbing the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    _add_digit_prior(model, tokenizer, DIGIT_PRIOR_LOGIT)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    return out_dir

"""A small byte-level BPE tokenizer trained locally, so nothing comes from a model hub."""

from __future__ import annotations

import random
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from verl_pipe.assets import math_data

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN]
VOCAB_SIZE = 1536

# Qwen2/Qwen3's split pattern: `\p{N}` alone makes every digit its own pre-token, so BPE can never merge
# digits and an answer "7" is always the single token "7".
_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen3's template without the thinking/tool branches: the chat markup verl and vLLM expect from a Qwen model.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Common English words so that merges cover ordinary text and not only the arithmetic prompts.
_ENGLISH = """
the of and to in is it that for on with as was at by be this from or an are not have but all they one can
had her his there were what which when your said we each she how their will other about out many then them
these so some would make like him into time has look two more write go see number way could people than
first water been call who oil its now find long down day did get come made may part over new sound take only
little work know place year live me back give most very after thing our just name good sentence man say great
where help through much before line right too mean old any same tell boy follow came want show also around
form three small set put end does another well large must big even such because turn here why ask went men
read need land different home us move try kind hand picture again change off play spell air away animal house
point page letter mother found study still learn should world high every near add food between own below
country plant last school father keep tree never start city earth eye light thought head under story saw left
few while along might close something seem next hard open example begin life always those both paper together
got group often run important until children side feet car mile night walk white sea began grow took river
four carry state once book hear stop without second later miss idea enough eat face watch far really almost
let above girl sometimes mountain cut young talk soon list song being leave family body music color stand sun
question fish area mark dog horse birds problem complete room knew since ever piece told usually friends easy
heard order red door sure become top ship across today during short better best however low hours black
products happened whole measure remember early waves reached listen wind rock space covered fast several hold
himself toward five step morning passed vowel true hundred against pattern numeral table north slowly money
map farm pulled draw voice seen cold cried plan notice south sing war ground fall king town unit figure
certain field travel wood fire upon done english road half ten fly gave box finally wait correct oh quickly
person became shown minutes strong verb stars front feel fact inches street decided contain course surface
produce building ocean class note nothing rest carefully scientists inside wheels stay green known island week
less machine base ago stood plane system behind ran round boat game force brought understand warm common bring
explain dry though language shape deep thousands yes clear equation yet government filled heat full hot check
object bread rule among noun power cannot able six size dark ball material special heavy fine pair circle
include built answer think final result compute value sum product difference modulo digit remainder therefore
subtract multiply divide equal zero plus minus times hello model train reward policy sample token response
prompt assistant user system seven eight nine eleven twelve twenty thirty forty fifty sixty seventy eighty
ninety thousand million count total divided remainder equals twice double triple quarter fraction percent
""".split()


def _corpus(seed: int = 0, n_lines: int = 4000, sample_corpus=math_data.sample_corpus) -> list[str]:
    """Half the task's text (``sample_corpus(n, seed)``: prompts and worked solutions), half English words."""
    rng = random.Random(seed)
    lines = sample_corpus(n_lines // 2, seed)
    for _ in range(n_lines // 2):
        words = rng.choices(_ENGLISH, k=rng.randint(4, 16))
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return lines


def _train_tokenizer(sample_corpus=math_data.sample_corpus) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        # Every byte is a token, so any text (and any digit) encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(sample_corpus=sample_corpus), trainer=trainer)
    return tok


def build_tokenizer(out_dir: Path, sample_corpus=math_data.sample_corpus) -> PreTrainedTokenizerFast:
    """The tokenizer trained on a task's text (its ``sample_corpus``) and English words, saved to ``out_dir``."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_train_tokenizer(sample_corpus),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )
    tokenizer.save_pretrained(str(out_dir))
    return tokenizer

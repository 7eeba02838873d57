"""Tiny models built locally for the tests: a character tokenizer and a random Llama, identical
for a given seed, small enough for CPU tests (no hub)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"


def char_tokenizer(alphabet: str, *, pad_is_eos: bool = False) -> PreTrainedTokenizerFast:
    """A character-level tokenizer built locally (no hub): ids 0..2 are specials, then one id per
    character of ``alphabet``. ``pad_is_eos`` mimics the many tokenizers that pad with EOS."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel

    if len(set(alphabet)) != len(alphabet):
        raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
    vocab = {PAD_TOKEN: 0, EOS_TOKEN: 1, UNK_TOKEN: 2}
    vocab.update({char: i + 3 for i, char in enumerate(alphabet)})
    backend = Tokenizer(WordLevel(vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=EOS_TOKEN if pad_is_eos else PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
    )


def tiny_causal_lm(
    vocab_size: int,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    eos_token_id: int = 1,
    pad_token_id: int = 0,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised Llama small enough for CPU tests, identical for a given seed."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = eos_token_id
    return model


def next_token_lm(
    tokenizer: PreTrainedTokenizerFast, rules: dict[str, str], *, margin: float = 4.0
) -> LlamaForCausalLM:
    """A tiny Llama built to write known text: after each character of ``rules`` its greedy
    next token is the one mapped (``EOS_TOKEN`` ends), after any other character EOS. Every
    layer adds nothing to the residual (its output projections are zero), so the last token
    alone decides, by a logit gap of ``margin * sqrt(hidden_size)`` (32 by default): the same
    answer on any CPU and floating-point path, and a few small training steps keep it."""
    ids = tokenizer.convert_tokens_to_ids
    model = tiny_causal_lm(len(tokenizer), eos_token_id=ids(EOS_TOKEN))
    if len(rules) >= model.config.hidden_size:  # a slot each, and slot 0 for the others
        raise ValueError(f"{len(rules)} rules: at most {model.config.hidden_size - 1}")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embedding, head = model.model.embed_tokens.weight, model.lm_head.weight
        embedding.zero_()
        embedding[:, 0] = 1.0  # slot 0: any character without a rule
        head.zero_()
        head[ids(EOS_TOKEN), 0] = margin
        for slot, (char, following) in enumerate(rules.items(), 1):
            embedding[ids(char)] = 0.0
            embedding[ids(char), slot] = 1.0
            head[ids(following), slot] = margin
    return model

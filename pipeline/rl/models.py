"""Model pieces of the RL update: completion logits and log-probs, a critic, tiny test models.

Logits are computed only at the positions that predict completion tokens (``logits_to_keep``),
in float32: the vocabulary projection of the prompt is never materialised, and the ratio
``exp(logp - old_logp)`` is not swamped by bf16 rounding.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

if TYPE_CHECKING:
    from .rollouts import ModelInputs

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"


def completion_logits(model: nn.Module, inputs: ModelInputs) -> Tensor:
    """``[b, t, V]`` float32 logits (divided by each row's sampling temperature) predicting each
    completion token.

    Prompts are left-padded and completions right-padded, so the completion occupies the last
    ``t`` columns and the hidden states at columns ``-t-1 .. -2`` predict it.
    """
    sequence_length = inputs.input_ids.shape[1]
    num_tokens = inputs.completion_ids.shape[1]
    # Indices rather than a trailing count: the logits come out contiguous, with no slice
    # (and no full-size zero-filled slice gradient) over the vocabulary dimension.
    keep = torch.arange(
        sequence_length - num_tokens - 1, sequence_length - 1, device=inputs.input_ids.device
    )
    outputs = model(
        input_ids=inputs.input_ids,
        attention_mask=inputs.attention_mask,
        position_ids=inputs.position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    logits = outputs.logits.float()
    if bool((inputs.temperature == 1).all()):
        return logits
    return logits / inputs.temperature.to(logits)[:, None, None]


def completion_logprobs(logits: Tensor, completion_ids: Tensor) -> Tensor:
    """``[b, t]`` log-probability of each completion token (fused log-softmax + gather)."""
    flat = -F.cross_entropy(logits.flatten(0, 1), completion_ids.flatten(), reduction="none")
    return flat.view(completion_ids.shape)


class ValueModel(nn.Module):
    """Critic ``V(s_t)``: a transformer backbone plus a scalar head on its last hidden state.

    ``V(s_t)`` is read at the position that predicts completion token ``t`` (the state before
    emitting it), the same positions :func:`completion_logits` uses.
    """

    def __init__(self, backbone: PreTrainedModel) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(
            backbone.config.get_text_config().hidden_size, 1, dtype=backbone.dtype
        )
        # Zero start: the first advantages are the plain returns, not the noise of a random head.
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: PreTrainedModel) -> ValueModel:
        """A critic whose backbone is a copy of the policy's (the usual PPO initialisation).
        Build it before any LoRA wrapping, or the copy carries the adapters."""
        return cls(copy.deepcopy(policy.get_decoder()))

    def forward(self, inputs: ModelInputs) -> Tensor:
        num_tokens = inputs.completion_ids.shape[1]
        hidden = self.backbone(
            input_ids=inputs.input_ids,
            attention_mask=inputs.attention_mask,
            position_ids=inputs.position_ids,
            use_cache=False,
        ).last_hidden_state[:, -num_tokens - 1 : -1]
        return self.head(hidden).squeeze(-1).float()


class ActorCritic(nn.Module):
    """Policy and optional critic as one module, so DDP/FSDP wrap, sync and reduce them together
    (one ``no_sync``, one backward for the joint PPO loss)."""

    def __init__(self, policy: nn.Module, critic: ValueModel | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.critic = critic

    def forward(self, inputs: ModelInputs) -> tuple[Tensor, Tensor | None]:
        logits = completion_logits(self.policy, inputs)
        values = self.critic(inputs) if self.critic is not None else None
        return logits, values


def disable_dropout(module: nn.Module) -> None:
    """Zero every dropout: with dropout on, the first PPO ratio is not 1 and old logprobs drift."""
    for submodule in module.modules():
        if isinstance(submodule, nn.Dropout):
            submodule.p = 0.0


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

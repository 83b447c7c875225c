"""The policy model: the Llama / Qwen2 / Qwen3 decoder in plain torch (nanoGPT-style, one file).

RMSNorm, rotary position embeddings (Llama's rotate-half convention, with `linear` or
`llama3` frequency scaling), SwiGLU MLP and grouped-query attention; the three families
differ only in switches of `ModelConfig`: Qwen2 puts biases on q/k/v, Qwen3 normalises
q and k per head (and often has a `head_dim` that is not hidden / heads), and any of
them may tie the output layer to the embeddings. Parameter names equal Hugging Face's
`*ForCausalLM`, so `state_dict()` is the safetensors of an HF directory and the same
directory loads in `transformers` and SGLang (see `trainer.checkpoint`,
`trainer.hf_config`).

Two ways in:
- `model(input_ids)` → logits (B, T, V): full causal forward, for training and scoring.
- `model.forward_cached(input_ids, start, cache)` → logits: writes the new tokens' keys
  and values into `cache` at per-row offsets `start` and attends over everything before
  them. Prefill (one row, T tokens, start 0 or a chunk offset) and batched decode (B
  rows, one token each, different lengths) are the same call; rows shorter than the
  longest are masked, so ragged batches need no special path.

Parameters may be fp32 or bf16 (`model.to(dtype)`); norms and rotary tables are
computed in fp32 as `transformers` does, so both dtypes match it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from trainer.settings import ModelSettings


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: `linear` divides every frequency by `factor`; `llama3` divides
    only the low frequencies and blends the band between (Llama 3.x)."""

    kind: Literal["linear", "llama3"]
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    max_position: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    head_dim: int = 0  # 0: hidden_size // num_heads
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False  # Qwen2; Llama/Qwen3 `attention_bias` sets it and o_bias
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm of each head's query and key
    tie_word_embeddings: bool = False
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self) -> None:
        if not self.head_dim:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> ModelConfig:
        return cls(
            vocab_size=settings.vocab_size,
            hidden_size=settings.hidden_size,
            num_layers=settings.num_layers,
            num_heads=settings.num_heads,
            num_kv_heads=settings.num_kv_heads,
            intermediate_size=settings.intermediate_size,
            max_position=settings.max_position,
            rope_theta=settings.rope_theta,
        )


class KVCache:
    """Keys and values per layer, each (rows, kv_heads, capacity, head_dim).

    Rows may be views into a larger buffer (the engine prefills into one row of its
    batch buffer this way); the cache itself keeps no lengths: callers pass `start`."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        self.keys = keys
        self.values = values

    @classmethod
    def empty(
        cls,
        config: ModelConfig,
        rows: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        shape = (rows, config.num_kv_heads, capacity, config.head_dim)
        return cls(
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)],
            [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_layers)],
        )

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def row(self, index: int) -> KVCache:
        """A one-row view; writes through it land in this cache."""
        return KVCache([k[index : index + 1] for k in self.keys], [v[index : index + 1] for v in self.values])


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 as HF does, so bf16 runs match it too.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def inverse_frequencies(config: ModelConfig, device: torch.device | None = None) -> torch.Tensor:
    """The rotary inverse frequencies (head_dim / 2,), fp32, scaled as `config.rope_scaling` says."""
    dim = config.head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float()
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    return _llama3_frequencies(inv_freq, scaling)


def _llama3_frequencies(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3's rule: wavelengths longer than original/low_freq_factor are slowed by `factor`,
    shorter than original/high_freq_factor kept, and the band between blended linearly."""
    low_freq_wavelen = s.original_max_position / s.low_freq_factor
    high_freq_wavelen = s.original_max_position / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    band = s.high_freq_factor - s.low_freq_factor
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / band
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, head_dim), fp32, for integer positions (B, T)."""
    angles = positions.to(torch.float32)[..., None] * inv_freq.to(positions.device)
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x * cos.to(x.dtype)) + (rotated * sin.to(x.dtype))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        head_dim, heads, kv_heads = config.head_dim, config.num_heads, config.num_kv_heads
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=config.o_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as (B, heads, T, head_dim), q and k normalised per head where the family does."""
        batch, length, _ = x.shape
        shape = (batch, length, -1, self.config.head_dim)
        q, k = self.q_proj(x).view(shape), self.k_proj(x).view(shape)
        if self.config.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), self.v_proj(x).view(shape).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None,
    ) -> torch.Tensor:
        """`cache` = (keys, values, write positions (B, T), attended length) or None (causal)."""
        batch, length, _ = x.shape
        q, k, v = self._heads(x)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            keys, values, write_at, attended = cache
            rows = torch.arange(batch, device=x.device)[:, None]
            keys[rows, :, write_at] = k.transpose(1, 2).to(keys.dtype)
            values[rows, :, write_at] = v.transpose(1, 2).to(values.dtype)
            k, v = keys[:, :, :attended], values[:, :, :attended]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and cache is None, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        bias = config.mlp_bias
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, mask, cache):  # type: ignore[no-untyped-def]
        x = x + self.self_attn(self.input_layernorm(x), rope, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """HF's `model.` prefix: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class PolicyModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # A plain attribute, not a buffer: `.to(bfloat16)` must not round it (HF keeps it fp32 too).
        self.inv_freq = inverse_frequencies(config)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def init_weights(self, seed: int) -> None:
        """Deterministic random init (normal, std 0.02; norms at 1, biases at 0) from `seed`.

        Drawn on CPU and copied to each parameter's device, so every device gets the
        same initial weights."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in sorted(self.named_parameters()):
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                elif name.endswith(".bias"):
                    param.zero_()
                else:
                    param.copy_(torch.randn(param.shape, generator=generator, device="cpu") * 0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full causal forward: input_ids (B, T) → logits (B, T, vocab)."""
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        rope = rope_tables(self.inv_freq, positions)
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x, rope, None, None)
        return self.lm_head(self.model.norm(x))

    def forward_cached(self, input_ids: torch.Tensor, start: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """input_ids (B, T) placed at positions start[b] .. start[b]+T-1 of each row → logits (B, T, V).

        Keys/values are written into `cache`; each row attends to its own positions
        0 .. start[b]+t. The caller guarantees start[b] + T <= cache.capacity."""
        length, device = input_ids.shape[1], input_ids.device
        positions = start.to(device)[:, None] + torch.arange(length, device=device)[None, :]
        attended = int(positions.max()) + 1
        key_positions = torch.arange(attended, device=device)[None, None, None, :]
        mask = key_positions <= positions[:, None, :, None]  # (B, 1, T, attended)
        rope = rope_tables(self.inv_freq, positions)
        x = self.model.embed_tokens(input_ids)
        for index, layer in enumerate(self.model.layers):
            layer_cache = (cache.keys[index], cache.values[index], positions, attended)
            x = layer(x, rope, mask, layer_cache)
        return self.lm_head(self.model.norm(x))


def build_model(config: ModelConfig, seed: int = 0) -> PolicyModel:
    model = PolicyModel(config)
    model.init_weights(seed)
    return model.eval()

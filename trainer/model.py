"""The policy model: a Llama-shaped decoder in plain torch (nanoGPT-style, one file).

RMSNorm, rotary position embeddings (Llama's rotate-half convention), SwiGLU MLP and
grouped-query attention. Parameter names equal Hugging Face's `LlamaForCausalLM`, so
`state_dict()` is the `model.safetensors` of an HF model directory and the same
directory loads in `transformers` and SGLang (see `trainer.checkpoint`).

Two ways in:
- `model(input_ids)` → logits (B, T, V): full causal forward, for training and scoring.
- `model.forward_cached(input_ids, start, cache)` → logits: writes the new tokens' keys
  and values into `cache` at per-row offsets `start` and attends over everything before
  them. Prefill (one row, T tokens, start 0 or a chunk offset) and batched decode (B
  rows, one token each, different lengths) are the same call; rows shorter than the
  longest are masked, so ragged batches need no special path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainer.settings import ModelSettings


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

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("head dimension (hidden_size / num_heads) must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

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


def rope_tables(config: ModelConfig, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (B, 1, T, head_dim) for integer positions (B, T), on their device."""
    dim = config.head_dim
    steps = torch.arange(0, dim, 2, dtype=torch.float32, device=positions.device)
    inv_freq = 1.0 / (config.rope_theta ** (steps / dim))
    angles = positions.to(torch.float32)[..., None] * inv_freq
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
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None,
    ) -> torch.Tensor:
        """`cache` = (keys, values, write positions (B, T), attended length) or None (causal)."""
        batch, length, _ = x.shape
        head_dim = self.config.head_dim
        q = self.q_proj(x).view(batch, length, -1, head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, -1, head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, -1, head_dim).transpose(1, 2)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            keys, values, write_at, attended = cache
            rows = torch.arange(batch, device=x.device)[:, None]
            keys[rows, :, write_at] = k.transpose(1, 2)
            values[rows, :, write_at] = v.transpose(1, 2)
            k, v = keys[:, :, :attended], values[:, :, :attended]
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and cache is None, enable_gqa=True
        )
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

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

    def init_weights(self, seed: int) -> None:
        """Deterministic random init (normal, std 0.02; norms at 1) from `seed`.

        Drawn on CPU and copied to each parameter's device, so every device gets the
        same initial weights."""
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in sorted(self.named_parameters()):
                if name.endswith("layernorm.weight") or name == "model.norm.weight":
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn(param.shape, generator=generator, device="cpu") * 0.02)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full causal forward: input_ids (B, T) → logits (B, T, vocab)."""
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        rope = rope_tables(self.config, positions)
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
        rope = rope_tables(self.config, positions)
        x = self.model.embed_tokens(input_ids)
        for index, layer in enumerate(self.model.layers):
            layer_cache = (cache.keys[index], cache.values[index], positions, attended)
            x = layer(x, rope, mask, layer_cache)
        return self.lm_head(self.model.norm(x))


def build_model(config: ModelConfig, seed: int = 0) -> PolicyModel:
    model = PolicyModel(config)
    model.init_weights(seed)
    return model.eval()

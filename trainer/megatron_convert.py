"""Weights between our Hugging Face layout and megatron-core's GPTModel (pure torch, no megatron import).

Contract. `hf_to_megatron(state, config)` takes a `*ForCausalLM`-named state dict (Llama, Qwen2,
Qwen3: what `PolicyModel.state_dict()` and `model.safetensors` hold) and returns the state dict
of a megatron-core `GPTModel` built with the Transformer Engine layer spec
(`get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_norm)`), tensor and pipeline
parallel size 1; `megatron_to_hf(state, config)` is its inverse. Both first refuse a config
megatron-core cannot express (`check_supported`), then check every key and shape against
`config` and raise `ConversionError` naming what is missing, unexpected or mis-shaped.

Names (checked against megatron-core 0.16.1: models/gpt/gpt_model.py, models/gpt/gpt_layer_specs.py,
transformer/attention.py `SelfAttention.__init__` and `get_query_key_value_tensors`,
transformer/mlp.py `MLP.__init__` and `glu`, extensions/transformer_engine.py `TENorm`; `{a}` is
`decoder.layers.{i}.self_attention`, `{m}` is `decoder.layers.{i}.mlp`, HF names under
`model.layers.{i}.`):

    model.embed_tokens.weight          embedding.word_embeddings.weight
    input_layernorm.weight             {a}.linear_qkv.layer_norm_weight
    self_attn.{q,k,v}_proj.weight      {a}.linear_qkv.weight         fused, grouped per query group
    self_attn.{q,k,v}_proj.bias        {a}.linear_qkv.bias           Qwen2; grouped like the weight
    self_attn.q_norm.weight            {a}.q_layernorm.weight        Qwen3 (RMSNorm per head, TENorm)
    self_attn.k_norm.weight            {a}.k_layernorm.weight        Qwen3
    self_attn.o_proj.weight / .bias    {a}.linear_proj.weight / .bias
    post_attention_layernorm.weight    {m}.linear_fc1.layer_norm_weight
    mlp.{gate,up}_proj.weight / .bias  {m}.linear_fc1.weight / .bias  fused: gate rows, then up rows
    mlp.down_proj.weight / .bias       {m}.linear_fc2.weight / .bias
    model.norm.weight                  decoder.final_layernorm.weight
    lm_head.weight                     output_layer.weight           untied only

The fused QKV is grouped per query group, as `get_query_key_value_tensors` splits it: for each
kv head g, the rows of the `num_heads / num_kv_heads` query heads of that group, then k_g, then
v_g (shape `(num_kv_heads * (heads_per_group + 2) * head_dim, hidden)`; its bias the same rows).
`head_dim` is megatron's `kv_channels` and need not be hidden / heads (Qwen3). fc1 is gate then
up (`glu` takes `silu(first half) * second half`, after adding fc1's bias).

Tied embeddings (`tie_word_embeddings`, megatron's `share_embeddings_and_output_weights=True`):
the GPTModel has no `output_layer.weight` (gpt_model.py: `skip_weight_param_allocation`); the HF
side may omit `lm_head.weight` (as `save_pretrained` does) or carry a copy equal to the
embedding; a different one is refused. `megatron_to_hf` returns `lm_head.weight` as the
embedding tensor itself, as `PolicyModel.state_dict()` does; `trainer.checkpoint.save_weights`
leaves it out of a tied directory.

What megatron-core 0.16 cannot express (`unsupported_features`): a bias on the attention output
or the MLP without biases everywhere (`add_qkv_bias` covers q/k/v only, `add_bias_linear` every
linear layer, so qkv-only and all-biases convert, o_proj or MLP bias alone does not), and
`llama3` rope scaling with other than the fixed low_freq_factor 1, high_freq_factor 4,
original_max_position_embeddings 8192 of models/common/embeddings/rotary_pos_embedding.py
`RotaryEmbedding._apply_scaling` (only `factor` is a GPTModel argument). `linear` scaling is
GPTModel's `seq_len_interpolation_factor`; see `trainer.megatron_backend.gpt_model_kwargs`.

Transformer Engine also puts `*._extra_state` entries (fp8 metadata, not weights) into a
GPTModel's state dict; `megatron_to_hf` ignores them and `hf_to_megatron` does not produce
them (load with `strict=False` and check the missing keys are only those; see
`trainer.megatron_backend`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainer.model import ModelConfig

EXTRA_STATE_SUFFIX = "._extra_state"
HF_HEAD, HF_EMBEDDING = "lm_head.weight", "model.embed_tokens.weight"
# RotaryEmbedding._apply_scaling's fixed llama3 parameters (megatron-core 0.16.1).
MEGATRON_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position": 8192}

Shapes = dict[str, tuple[int, ...]]


class ConversionError(ValueError):
    """A state dict that does not match the layout `config` describes, or a config megatron cannot build."""


def unsupported_features(config: ModelConfig) -> list[str]:
    """What of `config` megatron-core 0.16's GPTModel cannot express, one line per feature (see docstring)."""
    problems = []
    biases = (config.qkv_bias, config.o_bias, config.mlp_bias)
    if (config.o_bias or config.mlp_bias) and not all(biases):
        problems.append(
            f"biases qkv_bias={config.qkv_bias}, o_bias={config.o_bias}, mlp_bias={config.mlp_bias} "
            "(config.json `attention_bias` / `mlp_bias`): megatron-core has `add_qkv_bias` (q/k/v only) and "
            "`add_bias_linear` (every linear layer), not a bias on o_proj or the MLP alone"
        )
    scaling = config.rope_scaling
    if scaling is not None and scaling.kind == "llama3":
        given = {name: getattr(scaling, name) for name in MEGATRON_LLAMA3_FIXED}
        if given != MEGATRON_LLAMA3_FIXED:
            problems.append(
                f"llama3 rope scaling with {given}: megatron-core's RotaryEmbedding fixes "
                f"{MEGATRON_LLAMA3_FIXED} (config.json `rope_scaling` low_freq_factor, high_freq_factor, "
                "original_max_position_embeddings)"
            )
    return problems


def check_supported(config: ModelConfig) -> None:
    """Raise ConversionError naming every feature of `config` megatron-core cannot build."""
    problems = unsupported_features(config)
    if problems:
        raise ConversionError(
            f"the megatron backend cannot build this {config.architecture}: {'; '.join(problems)}. "
            'Train it with the torch backend (trainer.backend = "torch")'
        )


def hf_shapes(config: ModelConfig) -> Shapes:
    """Every parameter of the HF layout and its shape (`lm_head.weight` only when untied)."""
    hidden, head_dim, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q_rows, kv_rows = config.num_heads * head_dim, config.num_kv_heads * head_dim
    shapes: Shapes = {HF_EMBEDDING: (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}"
        shapes[f"{p}.input_layernorm.weight"] = (hidden,)
        for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            shapes[f"{p}.self_attn.{name}.weight"] = (rows, hidden)
            if config.qkv_bias:
                shapes[f"{p}.self_attn.{name}.bias"] = (rows,)
        if config.qk_norm:
            shapes[f"{p}.self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{p}.self_attn.k_norm.weight"] = (head_dim,)
        shapes[f"{p}.self_attn.o_proj.weight"] = (hidden, q_rows)
        if config.o_bias:
            shapes[f"{p}.self_attn.o_proj.bias"] = (hidden,)
        shapes[f"{p}.post_attention_layernorm.weight"] = (hidden,)
        for name, rows, cols in (
            ("gate_proj", inter, hidden),
            ("up_proj", inter, hidden),
            ("down_proj", hidden, inter),
        ):
            shapes[f"{p}.mlp.{name}.weight"] = (rows, cols)
            if config.mlp_bias:
                shapes[f"{p}.mlp.{name}.bias"] = (rows,)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes[HF_HEAD] = (config.vocab_size, hidden)
    return shapes


def megatron_shapes(config: ModelConfig) -> Shapes:
    """Every parameter of the megatron-core GPTModel (TE spec, TP=PP=1) and its shape."""
    hidden, inter, head_dim = config.hidden_size, config.intermediate_size, config.head_dim
    qkv_rows = (config.num_heads + 2 * config.num_kv_heads) * head_dim
    shapes: Shapes = {"embedding.word_embeddings.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        a, m = f"decoder.layers.{i}.self_attention", f"decoder.layers.{i}.mlp"
        shapes[f"{a}.linear_qkv.layer_norm_weight"] = (hidden,)
        shapes[f"{a}.linear_qkv.weight"] = (qkv_rows, hidden)
        if config.qkv_bias:
            shapes[f"{a}.linear_qkv.bias"] = (qkv_rows,)
        if config.qk_norm:
            shapes[f"{a}.q_layernorm.weight"] = (head_dim,)
            shapes[f"{a}.k_layernorm.weight"] = (head_dim,)
        shapes[f"{a}.linear_proj.weight"] = (hidden, config.num_heads * head_dim)
        shapes[f"{m}.linear_fc1.layer_norm_weight"] = (hidden,)
        shapes[f"{m}.linear_fc1.weight"] = (2 * inter, hidden)
        shapes[f"{m}.linear_fc2.weight"] = (hidden, inter)
        if config.o_bias:  # with mlp_bias too: check_supported allows only all biases or q/k/v alone
            shapes[f"{a}.linear_proj.bias"] = (hidden,)
        if config.mlp_bias:
            shapes[f"{m}.linear_fc1.bias"] = (2 * inter,)
            shapes[f"{m}.linear_fc2.bias"] = (hidden,)
    shapes["decoder.final_layernorm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["output_layer.weight"] = (config.vocab_size, hidden)
    return shapes


def _renames(config: ModelConfig) -> list[tuple[str, str]]:
    """(HF name, megatron name) of every tensor copied as it is."""
    pairs = [
        (HF_EMBEDDING, "embedding.word_embeddings.weight"),
        ("model.norm.weight", "decoder.final_layernorm.weight"),
    ]
    if not config.tie_word_embeddings:
        pairs.append((HF_HEAD, "output_layer.weight"))
    layer = [
        ("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight"),
        ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
        ("post_attention_layernorm.weight", "mlp.linear_fc1.layer_norm_weight"),
        ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
    ]
    if config.qk_norm:
        layer += [
            ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
            ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
        ]
    if config.o_bias:
        layer.append(("self_attn.o_proj.bias", "self_attention.linear_proj.bias"))
    if config.mlp_bias:
        layer.append(("mlp.down_proj.bias", "mlp.linear_fc2.bias"))
    for i in range(config.num_layers):
        pairs += [(f"model.layers.{i}.{hf}", f"decoder.layers.{i}.{mg}") for hf, mg in layer]
    return pairs


def _fusions(config: ModelConfig) -> list[tuple[tuple[str, ...], str]]:
    """(HF names, megatron name) of every fused tensor: (q, k, v) → linear_qkv, (gate, up) → linear_fc1."""
    kinds = ["weight", "bias"] if config.qkv_bias else ["weight"]
    fc1_kinds = ["weight", "bias"] if config.mlp_bias else ["weight"]
    fused: list[tuple[tuple[str, ...], str]] = []
    for i in range(config.num_layers):
        hf, mg = f"model.layers.{i}", f"decoder.layers.{i}"
        for kind in kinds:
            qkv = tuple(f"{hf}.self_attn.{name}_proj.{kind}" for name in "qkv")
            fused.append((qkv, f"{mg}.self_attention.linear_qkv.{kind}"))
        for kind in fc1_kinds:
            fused.append(
                ((f"{hf}.mlp.gate_proj.{kind}", f"{hf}.mlp.up_proj.{kind}"), f"{mg}.mlp.linear_fc1.{kind}")
            )
    return fused


def _checked(state: Mapping[str, torch.Tensor], expected: Shapes, layout: str) -> None:
    """Raise ConversionError unless `state` has exactly the keys and shapes of `expected`."""
    keys = {k for k in state if not k.endswith(EXTRA_STATE_SUFFIX)}
    missing = sorted(set(expected) - keys)
    unexpected = sorted(keys - set(expected))
    if missing or unexpected:
        raise ConversionError(
            f"{layout} state dict does not match the model config: missing {missing[:8]}"
            f"{' …' if len(missing) > 8 else ''} ({len(missing)}), unexpected {unexpected[:8]}"
            f"{' …' if len(unexpected) > 8 else ''} ({len(unexpected)}); check that the weights belong "
            "to a model with these sizes and switches (config.json: biases, qk norm, tie_word_embeddings) "
            "and tensor/pipeline parallel size 1"
        )
    wrong = [
        f"{k}: {tuple(state[k].shape)} (expected {shape})"
        for k, shape in expected.items()
        if tuple(state[k].shape) != shape
    ]
    if wrong:
        raise ConversionError(
            f"{layout} state dict has tensors of the wrong shape for the model config: {wrong[:8]}; "
            "the weights come from a model of other sizes"
        )


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """q/k/v projection weights (or biases) → megatron's fused tensor, grouped per query group."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    rest = q.shape[1:]
    fused = torch.cat(
        [
            q.reshape(groups, per_group * head_dim, -1),
            k.reshape(groups, head_dim, -1),
            v.reshape(groups, head_dim, -1),
        ],
        dim=1,
    )
    return fused.reshape(groups * (per_group + 2) * head_dim, *rest)


def split_qkv(qkv: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """megatron's fused QKV weight (or bias) → (q_proj, k_proj, v_proj); the inverse of `fuse_qkv`."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, -1)
    q, k, v = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=1)
    return (
        q.reshape(config.num_heads * head_dim, *rest),
        k.reshape(groups * head_dim, *rest),
        v.reshape(groups * head_dim, *rest),
    )


def _without_tied_head(state: Mapping[str, torch.Tensor], config: ModelConfig) -> Mapping[str, torch.Tensor]:
    """A tied model's HF state without `lm_head.weight`, after checking it equals the embedding."""
    if not config.tie_word_embeddings or HF_HEAD not in state:
        return state
    head, embedding = state[HF_HEAD], state.get(HF_EMBEDDING)
    if embedding is not None and (head.shape != embedding.shape or not torch.equal(head, embedding)):
        raise ConversionError(
            f"the config ties the output layer to the embeddings (tie_word_embeddings), but {HF_HEAD} "
            f"differs from {HF_EMBEDDING}: these weights are of an untied model; set tie_word_embeddings "
            "to false"
        )
    return {k: t for k, t in state.items() if k != HF_HEAD}


def hf_to_megatron(state: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A HF (`*ForCausalLM`-named) state dict → megatron-core GPTModel names (new tensors)."""
    check_supported(config)
    state = _without_tied_head(state, config)
    _checked(state, hf_shapes(config), "HF")
    out = {mg: state[hf].clone() for hf, mg in _renames(config)}
    for parts, mg in _fusions(config):
        tensors = [state[name] for name in parts]
        out[mg] = fuse_qkv(*tensors, config) if len(tensors) == 3 else torch.cat(tensors, dim=0)
    return out


def megatron_to_hf(state: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A megatron-core GPTModel state dict → HF names (new tensors; `_extra_state` entries ignored).
    A tied model's `lm_head.weight` is its embedding tensor, as in `PolicyModel.state_dict()`."""
    check_supported(config)
    _checked(state, megatron_shapes(config), "megatron")
    out = {hf: state[mg].clone() for hf, mg in _renames(config)}
    for parts, mg in _fusions(config):
        pieces = split_qkv(state[mg], config) if len(parts) == 3 else torch.chunk(state[mg], 2, dim=0)
        out.update({name: piece.clone() for name, piece in zip(parts, pieces, strict=True)})
    if config.tie_word_embeddings:
        out[HF_HEAD] = out[HF_EMBEDDING]
    return out

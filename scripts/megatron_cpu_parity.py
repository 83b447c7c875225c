"""Our conversion against megatron-core itself, on CPU: GPTModel logits equal PolicyModel's.

Not part of the test suite (megatron-core is not a dependency there, and CI has no GPU). Run it
with megatron-core 0.16.x importable but NOT installed into .venv, e.g.:

    pip download --no-deps megatron-core==0.16.1 -d /tmp/mcore && unzip -q -d /tmp/mcore/src /tmp/mcore/*.whl
    PYTHONPATH=/tmp/mcore/src .venv/bin/python scripts/megatron_cpu_parity.py [MODEL_DIR]
    PYTHONPATH=/tmp/mcore/src .venv/bin/torchrun --standalone --nproc-per-node 2 \
        scripts/megatron_cpu_parity.py

For each config family (SmolLM2-like tied GQA, Qwen2-like q/k/v bias, Qwen3-like q/k norm with
head_dim != hidden/heads, Llama with every bias, llama3 and linear rope scaling), and for
MODEL_DIR's real weights when given, it builds megatron-core's GPTModel from
`trainer.megatron_backend.transformer_config_kwargs` / `gpt_model_kwargs`, loads the weights
`trainer.megatron_convert.hf_to_megatron` produced, and compares logits with `PolicyModel`.

The Transformer Engine spec runs only on a GPU, so this uses megatron's local spec
(`get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=...)`): the same modules and
names except the two norms TE fuses into `linear_qkv` / `linear_fc1`, renamed as megatron's own
`sharded_state_dict_keys_map` of that spec says; what megatron always puts on the GPU (the
rotary table, the default causal mask, the RNG fork around attention dropout) is kept on the CPU.
Prints one line per model and exits 1 when a max |logprob difference| exceeds BOUND.

Under torchrun with N ranks (gloo) it checks tensor parallelism instead: megatron-core's GPTModel
at tensor parallel N, each rank loading its shard from `trainer.megatron_parallel.tp_shard`
(families whose heads N does not divide get 4 heads / 2 kv heads), logits against `PolicyModel`;
the shards gathered back (`MegatronRanks.tp_pieces`, `tp_join`) equal the whole weights; and
after one backward of the same loss on both, `MegatronRanks.clip_grad_norm` (every shard's
squares summed over the tensor-parallel group, replicated parameters counted once) equals
PolicyModel's gradient norm.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.megatron_backend import SINGLE_LAYOUT, gpt_model_kwargs, transformer_config_kwargs
from trainer.megatron_convert import hf_to_megatron
from trainer.megatron_parallel import ParallelLayout, tp_shard
from trainer.model import ModelConfig, PolicyModel, RopeScaling

# fp32 on both sides; measured (megatron-core 0.16.1): ~1.4e-6 on the tiny configs, 8.1e-5 on
# SmolLM2-135M's 30 layers. A wrong rotary scaling alone moves logits by 2e-3 to 0.1.
BOUND = 2e-4
TE_TO_LOCAL = {
    ".self_attention.linear_qkv.layer_norm_weight": ".input_layernorm.weight",
    ".mlp.linear_fc1.layer_norm_weight": ".pre_mlp_layernorm.weight",
}
BASE = ModelConfig(
    vocab_size=211,
    hidden_size=72,
    num_layers=2,
    num_heads=9,
    num_kv_heads=3,
    intermediate_size=96,
    max_position=256,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
FAMILIES = {
    "smollm2-like (tied, GQA 9/3)": BASE,
    "qwen2-like (qkv bias, tied)": dataclasses.replace(
        BASE,
        num_heads=4,
        num_kv_heads=2,
        head_dim=0,
        qkv_bias=True,
        rope_theta=1e6,
        architecture="Qwen2ForCausalLM",
    ),
    "qwen3-like (qk norm, head_dim 24)": dataclasses.replace(
        BASE,
        num_heads=4,
        num_kv_heads=2,
        head_dim=24,
        qk_norm=True,
        tie_word_embeddings=False,
        architecture="Qwen3ForCausalLM",
    ),
    "llama, every bias": dataclasses.replace(BASE, qkv_bias=True, o_bias=True, mlp_bias=True),
    # head_dim 32 and theta 500,000: frequencies below, inside and above llama3's blended band.
    "llama3 rope scaling": dataclasses.replace(
        BASE, head_dim=32, rope_theta=500000.0, rope_scaling=RopeScaling("llama3", 8.0)
    ),
    "linear rope scaling": dataclasses.replace(BASE, head_dim=32, rope_scaling=RopeScaling("linear", 4.0)),
}


def init_megatron(tp: int = 1) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    if tp == 1:
        dist.init_process_group("gloo", rank=0, world_size=1)
    else:
        dist.init_process_group("gloo")  # torchrun's environment
    from megatron.core import parallel_state, tensor_parallel

    parallel_state.initialize_model_parallel(tp, 1)
    # RotaryEmbedding.get_emb moves its frequencies to torch.cuda.current_device() unconditionally
    # (rotary_pos_embedding.py); on a CPU machine that device is the CPU.
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    # Attention dropout (p=0 here) runs under a fork of the CUDA RNG tracker; no CUDA RNG on a CPU.
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *_args, **_kwargs: contextlib.nullcontext()


def random_model(config: ModelConfig, seed: int) -> PolicyModel:
    """Every parameter random (norms and biases too), so a swapped or mis-grouped tensor shows."""
    model = PolicyModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.05 * noise)
    return model.eval()


def local_gpt(
    config: ModelConfig, policy: PolicyModel, layout: ParallelLayout = SINGLE_LAYOUT
) -> torch.nn.Module:
    """megatron's GPTModel (local spec) holding this rank's tensor-parallel shard of `policy`'s weights."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = {**transformer_config_kwargs(config, layout), "use_cpu_initialization": True}
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=config.qk_norm)
    gpt = GPTModel(
        config=TransformerConfig(**kwargs), transformer_layer_spec=spec, **gpt_model_kwargs(config)
    )
    whole = hf_to_megatron(policy.state_dict(), config)
    state = tp_shard(whole, parallel_state.get_tensor_model_parallel_rank(), layout.tensor)
    for te_name, local_name in TE_TO_LOCAL.items():
        state = {k.replace(te_name, local_name): t for k, t in state.items()}
    missing, unexpected = gpt.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("._extra_state")]
    assert not missing and not unexpected, f"missing {missing}, unexpected {unexpected}"
    return gpt


def forward(gpt: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    # megatron's default causal mask is built on "cuda" (transformer/utils.py); the same mask,
    # True where masked, on the CPU.
    causal = torch.triu(torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool), diagonal=1)[None, None]
    return gpt(ids, positions, causal)


def megatron_logits(config: ModelConfig, policy: PolicyModel, ids: torch.Tensor) -> torch.Tensor:
    gpt = local_gpt(config, policy).eval()
    with torch.no_grad():
        return forward(gpt, ids)


def compare(label: str, config: ModelConfig, policy: PolicyModel, length: int) -> float:
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = policy(ids)
    theirs = megatron_logits(config, policy, ids)
    gap = float((theirs - ours).abs().max())
    logprob_gap = float((torch.log_softmax(theirs, -1) - torch.log_softmax(ours, -1)).abs().max())
    line = f"{label}: max |dlogit| {gap:.2e}, max |dlogprob| {logprob_gap:.2e}"
    if config.rope_scaling is not None:  # the check can fail: the same weights without the scaling
        unscaled = megatron_logits(dataclasses.replace(config, rope_scaling=None), policy, ids)
        line += f" (megatron without the scaling: {float((unscaled - ours).abs().max()):.2e})"
    print(line, flush=True)
    return logprob_gap


def tensor_parallel_check(label: str, config: ModelConfig, tp: int) -> float:
    """The module docstring's tensor-parallel checks for one family; the max |dlogprob|."""
    from trainer.megatron_backend import MegatronRanks
    from trainer.megatron_parallel import tp_join

    layout = ParallelLayout(tensor=tp, pipeline=1, data=1, expert=1)
    policy = random_model(config, seed=2)
    gpt = local_gpt(config, policy, layout)
    ranks = MegatronRanks(layout, torch.device("cpu"), gpt)
    whole = hf_to_megatron(policy.state_dict(), config)
    local = {
        k: t.detach() for k, t in gpt.state_dict().items() if torch.is_tensor(t) and "_extra_state" not in k
    }
    for te_name, local_name in TE_TO_LOCAL.items():
        local = {k.replace(local_name, te_name): t for k, t in local.items()}
    gathered = {name: tp_join(name, ranks.tp_pieces(name, tensor)) for name, tensor in local.items()}
    assert all(torch.equal(gathered[n], whole[n]) for n in whole), (
        "the gathered shards are not the whole weights"
    )
    ids = torch.randint(0, config.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    theirs, ours = forward(gpt, ids), policy.train()(ids)
    logprob_gap = float((torch.log_softmax(theirs, -1) - torch.log_softmax(ours, -1)).abs().max())
    (torch.log_softmax(theirs, -1)[..., :5].sum()).backward()
    (torch.log_softmax(ours, -1)[..., :5].sum()).backward()
    norm = ranks.clip_grad_norm(list(gpt.parameters()), max_norm=1e9)
    expected = float(torch.nn.utils.clip_grad_norm_(list(policy.parameters()), max_norm=1e9))
    if dist.get_rank() == 0:
        print(
            f"{label} at tensor parallel {tp}: max |dlogprob| {logprob_gap:.2e}, gathered shards equal, "
            f"grad norm {norm:.6f} vs {expected:.6f}",
            flush=True,
        )
    assert abs(norm - expected) <= 1e-6 * expected, f"grad norm {norm} != {expected}"
    return logprob_gap


def main_tensor_parallel(tp: int) -> int:
    init_megatron(tp)
    gaps = []
    for label, config in FAMILIES.items():
        if config.num_kv_heads % tp or config.num_heads % tp:
            config = dataclasses.replace(config, num_heads=4, num_kv_heads=2, head_dim=config.head_dim or 18)
        gaps.append(tensor_parallel_check(label, dataclasses.replace(config, vocab_size=210), tp))
    worst = max(gaps)
    if dist.get_rank() == 0:
        print(f"worst max |dlogprob| at tensor parallel {tp}: {worst:.2e} (bound {BOUND:g})")
    return 0 if worst <= BOUND else 1


def main() -> int:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return main_tensor_parallel(int(os.environ["WORLD_SIZE"]))
    init_megatron()
    gaps = [
        compare(label, config, random_model(config, i), 96)
        for i, (label, config) in enumerate(FAMILIES.items())
    ]
    if len(sys.argv) > 1:
        from trainer.checkpoint import load_model

        policy = load_model(Path(sys.argv[1]))
        gaps.append(compare(f"{sys.argv[1]} (real weights)", policy.config, policy, 48))
    worst = max(gaps)
    print(f"worst max |dlogprob| {worst:.2e} (bound {BOUND:g})")
    return 0 if worst <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())

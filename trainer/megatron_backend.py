"""The megatron-core training backend: `TrainBackend` (trainer.backends) on megatron-core's GPTModel.

Contract. `MegatronBackend(model, settings, lr=...)` takes the same arguments as `TorchBackend`
(a `PolicyModel` with HF parameter names, the trainer settings, the learning rate), builds a
megatron-core `GPTModel` of the same architecture with the Transformer Engine layer spec
(RMSNorm, SwiGLU, grouped-query attention, rotary embeddings in Llama's rotate-half convention;
per family: q/k/v biases as `add_qkv_bias`, Qwen3's per-head q/k norm as `qk_layernorm`, a
`head_dim` other than hidden / heads as `kv_channels`, tied embeddings as
`share_embeddings_and_output_weights`, rope scaling as `gpt_model_kwargs` says; what megatron
cannot express is refused by `trainer.megatron_convert.check_supported` before anything is
built), loads the weights through `trainer.megatron_convert.hf_to_megatron`, and
trains it with the very step functions the torch backend runs (`trainer.step.rl_step` /
`sft_step`, hence the same loss of `trainer.loss`, micro-batching and clipping): the GPTModel
is wrapped so that `model(input_ids)` returns (B, T, V) logits like `PolicyModel`.
`hf_state_dict()` converts back (`megatron_to_hf`), so published versions are ordinary HF
directories any engine loads.

Where it runs: a GPU machine (CUDA, or ROCm: HIP devices appear as `cuda`), megatron-core and
Transformer Engine installed (`pip install '.[gpu]'` plus TE for the machine), started by
torchrun. One process, tensor and pipeline parallel size 1: the loop consumes Kafka in one
process, and the conversion and `rl_step`'s global grad-norm clip are written for unsharded
weights. Data, tensor and pipeline parallelism are not built yet; other world sizes are refused.

Import safety: this module imports megatron-core only inside functions, so importing it (and
the test suite) works without megatron; constructing a backend without it raises
`MegatronUnavailable` saying what to install and how to run. Nothing here calls a CUDA-only
API beyond device selection (`torch.cuda.set_device`, the "nccl" process group, which ROCm
torch maps to RCCL), so a ROCm build of torch runs it unchanged.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainer.backends import restore_rng_states, rng_states, seed_everything
from trainer.batch import TrainSample
from trainer.megatron_convert import EXTRA_STATE_SUFFIX, check_supported, hf_to_megatron, megatron_to_hf
from trainer.model import ModelConfig, PolicyModel
from trainer.settings import TrainerSettings
from trainer.step import SftSequence, StepMetrics, make_optimizer, rl_step, sft_step

BACKEND_NAME = "megatron"
HOW_TO_RUN = (
    "install the `gpu` extra (pip install '.[gpu]') and Transformer Engine for this machine's CUDA or "
    "ROCm, then run the trainer under torchrun on a GPU machine (torchrun --nproc-per-node 1 ...)"
)


class MegatronUnavailable(RuntimeError):
    """megatron-core, Transformer Engine, a GPU or torchrun is missing."""


def _import(name: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise MegatronUnavailable(f"{what} is not importable ({error}); {HOW_TO_RUN}") from error


def require_megatron() -> ModuleType:
    """megatron.core, or MegatronUnavailable saying what to install (Transformer Engine included)."""
    core = _import("megatron.core", "megatron-core")
    _import("transformer_engine.pytorch", "Transformer Engine (the layer spec the conversion targets)")
    return core


def transformer_config_kwargs(config: ModelConfig) -> dict[str, Any]:
    """megatron-core `TransformerConfig` fields for `config` (no dropout, fp32); ConversionError for
    what megatron cannot express (`trainer.megatron_convert.check_supported`)."""
    check_supported(config)
    return {
        "num_layers": config.num_layers,
        "hidden_size": config.hidden_size,
        "ffn_hidden_size": config.intermediate_size,
        "num_attention_heads": config.num_heads,
        "num_query_groups": config.num_kv_heads,
        "kv_channels": config.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": config.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        # check_supported allows q/k/v biases alone (Qwen2) or biases on every linear layer.
        "add_bias_linear": config.o_bias and config.mlp_bias,
        "add_qkv_bias": config.qkv_bias,
        "qk_layernorm": config.qk_norm,  # Qwen3: RMSNorm of each head's q and k, eps as above
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "bias_activation_fusion": False,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "rotary_interleaved": False,  # Llama/HF rotate-half, as trainer.model applies it
        # fp32 weights and activations, as the torch backend and the embedded engine: keeps
        # trainer and engine logprobs within the same tolerance on either backend.
        "params_dtype": torch.float32,
        "pipeline_dtype": torch.float32,
        "tensor_model_parallel_size": 1,
        "pipeline_model_parallel_size": 1,
        "perform_initialization": False,  # the weights are loaded right after
    }


def _init_distributed(seed: int) -> torch.device:
    """torch.distributed and megatron's model-parallel state for one process; its device."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise MegatronUnavailable(f"torch sees no GPU (ROCm devices appear as cuda too); {HOW_TO_RUN}")
    if not dist.is_initialized():
        if "LOCAL_RANK" not in os.environ:
            raise MegatronUnavailable(f"not started by torchrun (LOCAL_RANK is unset); {HOW_TO_RUN}")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend="nccl")  # RCCL on ROCm builds of torch
    if dist.get_world_size() != 1:
        raise MegatronUnavailable(
            f"world size {dist.get_world_size()}: the megatron backend runs one process "
            "(tensor, pipeline and data parallelism are not built yet); use torchrun --nproc-per-node 1"
        )
    parallel_state = importlib.import_module("megatron.core.parallel_state")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    importlib.import_module("megatron.core.tensor_parallel").model_parallel_cuda_manual_seed(seed)
    return torch.device("cuda", torch.cuda.current_device())


def gpt_model_kwargs(config: ModelConfig) -> dict[str, Any]:
    """`GPTModel` arguments for `config` besides its config and spec: sizes, tying and rotary.

    Rope scaling (megatron-core 0.16.1 models/common/embeddings/rotary_pos_embedding.py):
    `linear` divides every frequency by `factor`, which is GPTModel's `seq_len_interpolation_factor`
    (positions divided by it); `llama3` is `rope_scaling=True` with `rope_scaling_factor`, its other
    three parameters fixed (`check_supported` refuses other values)."""
    check_supported(config)
    scaling = config.rope_scaling
    llama3 = scaling is not None and scaling.kind == "llama3"
    linear = scaling is not None and scaling.kind == "linear"
    return {
        "vocab_size": config.vocab_size,
        "max_sequence_length": config.max_position,
        "pre_process": True,
        "post_process": True,
        "parallel_output": False,
        "share_embeddings_and_output_weights": config.tie_word_embeddings,
        "position_embedding_type": "rope",
        "rotary_percent": 1.0,
        "rotary_base": config.rope_theta,
        "rope_scaling": llama3,
        "rope_scaling_factor": scaling.factor if scaling is not None and llama3 else 8.0,
        "seq_len_interpolation_factor": scaling.factor if scaling is not None and linear else None,
    }


def build_gpt_model(config: ModelConfig) -> nn.Module:
    """megatron-core's GPTModel of `config`'s architecture, TE layer spec, on the current device."""
    transformer_config = importlib.import_module("megatron.core.transformer.transformer_config")
    specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
    gpt = importlib.import_module("megatron.core.models.gpt.gpt_model")
    return gpt.GPTModel(
        config=transformer_config.TransformerConfig(**transformer_config_kwargs(config)),
        transformer_layer_spec=specs.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=config.qk_norm),
        **gpt_model_kwargs(config),
    )


class GPTLogits(nn.Module):
    """A GPTModel seen as `PolicyModel` is by `trainer.step`: `model(input_ids)` → (B, T, V) logits."""

    def __init__(self, gpt: nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device).expand(batch, length)
        # No mask: the TE spec's attention is causal, and trainer.step pads on the right.
        return self.gpt(input_ids, positions, None)


def load_megatron_state(gpt: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Load converted weights; TE's `_extra_state` (fp8 metadata) is the only thing allowed missing."""
    missing, unexpected = gpt.load_state_dict(dict(state), strict=False)
    missing = [k for k in missing if not k.endswith(EXTRA_STATE_SUFFIX)]
    if missing or unexpected:
        raise ValueError(
            f"the GPTModel built here does not match the converted weights: missing {missing}, "
            f"unexpected {unexpected}; megatron-core's parameter names changed (the conversion is checked "
            "against 0.16.x): pin the `gpu` extra's megatron-core or update trainer.megatron_convert"
        )


class MegatronBackend:
    """One GPU process: `trainer.step` over megatron-core's GPTModel (see the module docstring)."""

    def __init__(
        self, model: PolicyModel, settings: TrainerSettings, *, lr: float, temperature: float = 1.0
    ) -> None:
        check_supported(model.config)  # the model first: a refusal needs no GPU to be seen
        require_megatron()
        self.temperature = temperature
        self.config = model.config
        self.settings = settings
        self.device = _init_distributed(settings.seed)
        seed_everything(settings.seed)
        self.model = GPTLogits(build_gpt_model(self.config)).to(self.device)
        load_megatron_state(self.model.gpt, hf_to_megatron(model.state_dict(), self.config))
        self.model.train()
        self.optimizer = make_optimizer(self.model, settings, lr)

    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics:
        return rl_step(self.model, self.optimizer, samples, self.settings, self.device, self.temperature)

    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics:
        return sft_step(self.model, self.optimizer, sequences, self.settings, self.device)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        state = {k: t.detach() for k, t in self.model.gpt.state_dict().items() if torch.is_tensor(t)}
        hf = megatron_to_hf(state, self.config)
        return {name: t.float().cpu().contiguous() for name, t in hf.items()}

    def checkpoint_state(self) -> dict[str, Any]:
        """HF-named weights (as the torch backend's), this backend's optimizer state and RNG states."""
        tracker = importlib.import_module("megatron.core.tensor_parallel").get_cuda_rng_tracker()
        return {
            "backend": BACKEND_NAME,
            "model": self.hf_state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_states(),
            "megatron_rng": tracker.get_states(),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        if state.get("backend") != BACKEND_NAME:
            raise ValueError(
                f"the checkpoint was written by the {state.get('backend', 'torch')!r} backend: its optimizer "
                "state does not map onto megatron's parameters; resume with that backend, or start the "
                "megatron backend from the checkpoint's published weight version"
            )
        load_megatron_state(self.model.gpt, hf_to_megatron(state["model"], self.config))
        self.optimizer.load_state_dict(state["optimizer"])
        restore_rng_states(state["rng"])
        importlib.import_module("megatron.core.tensor_parallel").get_cuda_rng_tracker().set_states(
            state["megatron_rng"]
        )

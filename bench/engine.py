"""`rollstream bench engine`: decode throughput of the embedded engine against a plain loop.

Both sides run the same model (built from the [model] settings, random weights) in the
same process with the same torch thread count, on the same prompts, sampling with the
same function at temperature 1:

- engine: `batch` requests submitted to the embedded engine (continuous batching,
  scheduler thread, per-request state, logprobs, weight versions);
- plain: one batched prefill, then a `for` loop of batched decode steps over one
  contiguous KV cache: the floor an engine's bookkeeping is measured against.

Runs alternate (plain, engine, plain, ...) `--repeats` times per batch size and the
medians are reported. Last line: {"tokens_per_s_b1", "tokens_per_s_b16",
"tokens_per_s_b64", "ratio"} where ratio = engine / plain at batch 64 (target >= 0.8),
plus the plain loop's figures for reference.

With `--model DIR` (any supported Hugging Face directory, or a known name) the baseline is
`transformers`' own `generate` on the same directory, dtype (`--dtype`), prompts and batch
(`--batch`, default 8), sampling at temperature 1 with every one of `--new-tokens` forced
(no early stop). Last line: {"model", "dtype", "batch", "tokens_per_s",
"transformers_tokens_per_s", "ratio", ...}; target ratio >= 1.0 at batch 8 for SmolLM2 in bf16.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Annotated

import torch
import typer
from rich.progress import Progress

from agents.engine.engine import Engine
from agents.engine.protocol import SamplingParams
from agents.engine.sampling import BatchSampling, sample
from rollstream.command_line import ConfigPath, Overrides, console, read_config, resolve_model_dir
from rollstream.config import Config
from trainer.checkpoint import TORCH_DTYPES
from trainer.checkpoint import read_config as read_model_config
from trainer.model import KVCache, ModelConfig, PolicyModel, build_model

DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32"}

BATCH_SIZES = (1, 16, 64)


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(batch * 1000 + length)
    return torch.randint(3, vocab, (batch, length), generator=generator).tolist()


def plain_loop(model: PolicyModel, batch_prompts: list[list[int]], new_tokens: int) -> float:
    """Tokens/s of a batched prefill plus a decode loop over one contiguous KV cache."""
    batch, length = len(batch_prompts), len(batch_prompts[0])
    cache = KVCache.empty(model.config, batch, length + new_tokens, torch.float32)
    sampling = BatchSampling.build(
        [1.0] * batch, [1.0] * batch, [-1] * batch, list(range(batch)), [0] * batch
    )
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
    began = time.perf_counter()
    with torch.inference_mode():
        start = torch.zeros(batch, dtype=torch.long)
        logits = model.forward_cached(torch.tensor(batch_prompts), start, cache)
        tokens, logprobs = sample(logits[:, -1], sampling)
        outputs.append((tokens, logprobs))
        for step in range(1, new_tokens):
            start = torch.full((batch,), length + step - 1, dtype=torch.long)
            logits = model.forward_cached(tokens[:, None], start, cache)
            sampling = sampling.next_step()
            tokens, logprobs = sample(logits[:, -1], sampling)
            outputs.append((tokens, logprobs))
    elapsed = time.perf_counter() - began
    return batch * new_tokens / elapsed


def engine_run(engine: Engine, batch_prompts: list[list[int]], new_tokens: int) -> float:
    """Tokens/s of the same work submitted to the engine as independent requests."""
    run = uuid.uuid4().hex[:8]
    # Submit while paused so the batch starts together, as the plain loop's does; otherwise the
    # scheduler starts on the first arrivals and the measurement depends on submission speed.
    engine.pause()
    futures = [
        engine.submit(f"{run}-{i}", p, SamplingParams(max_new_tokens=new_tokens, seed=i))
        for i, p in enumerate(batch_prompts)
    ]
    began = time.perf_counter()
    engine.resume()
    generated = sum(len(f.result(timeout=600).output_ids) for f in futures)
    elapsed = time.perf_counter() - began
    if generated != len(batch_prompts) * new_tokens:
        raise RuntimeError(f"engine generated {generated} tokens, expected {len(batch_prompts) * new_tokens}")
    return generated / elapsed


def transformers_run(model: object, batch_prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """Tokens/s of `transformers`' generate on the same prompts: one batch, sampling at temperature 1,
    exactly `new_tokens` each (min_new_tokens keeps an end token from stopping a row early)."""
    ids = torch.tensor(batch_prompts)
    began = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[attr-defined]
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad_id,
        )
    elapsed = time.perf_counter() - began
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def against_transformers(
    settings: Config,
    model_dir: Path,
    dtype: str,
    batch: int,
    repeats: int,
    new_tokens: int,
    prompt_tokens: int,
) -> dict[str, object]:
    """Our engine vs transformers' generate on `model_dir` in `dtype`, alternating, medians."""
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(model_dir, dtype=TORCH_DTYPES[dtype]).eval()
    engine_settings = settings.engine.model_copy(
        update={
            "dtype": dtype,
            "max_running_requests": max(batch, 1),
            "context_length": prompt_tokens + new_tokens + 1,
        }
    )
    engine = Engine(model_dir, engine_settings).start()
    vocab = read_model_config(model_dir).model.vocab_size
    batch_prompts = prompts(batch, prompt_tokens, vocab)
    ours: list[float] = []
    baseline: list[float] = []
    try:
        engine_run(engine, batch_prompts, 4)  # warm-up on both sides
        transformers_run(theirs, batch_prompts, 4, pad_id=0)
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("benchmarking", total=repeats)
            for _ in range(repeats):
                baseline.append(transformers_run(theirs, batch_prompts, new_tokens, pad_id=0))
                ours.append(engine_run(engine, batch_prompts, new_tokens))
                progress.advance(task)
    finally:
        engine.stop()
    ours_s, theirs_s = statistics.median(ours), statistics.median(baseline)
    console.print(f"batch {batch}, {dtype}: engine {ours_s:,.1f} tok/s, transformers {theirs_s:,.1f} tok/s")
    return {
        "model": str(model_dir),
        "dtype": dtype,
        "batch": batch,
        "tokens_per_s": round(ours_s, 1),
        "transformers_tokens_per_s": round(theirs_s, 1),
        "ratio": round(ours_s / theirs_s, 3),
        "runs": [round(v, 1) for v in ours],
        "transformers_runs": [round(v, 1) for v in baseline],
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "prompt_tokens": prompt_tokens,
    }


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    repeats: Annotated[int, typer.Option(help="alternating runs per side and batch size")] = 5,
    new_tokens: Annotated[int, typer.Option(help="tokens generated per request")] = 64,
    prompt_tokens: Annotated[int, typer.Option(help="prompt length")] = 16,
    threads: Annotated[int, typer.Option(help="torch threads for both sides")] = 1,
    model: Annotated[
        str | None, typer.Option(help="a model directory or known name: compare with transformers' generate")
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="with --model: float32 | bfloat16 (or fp32 | bf16)")
    ] = "bfloat16",
    batch: Annotated[int, typer.Option(help="with --model: requests decoded together")] = 8,
) -> None:
    """Decode tokens/s at batch 1, 16 and 64: engine vs plain batched loop (same model, same run);
    with --model, the engine vs transformers' generate on that model."""
    settings = read_config(config, overrides)
    torch.set_num_threads(threads)
    if model is not None:
        model_dir = resolve_model_dir(settings, model)
        name = DTYPE_ALIASES.get(dtype, dtype)
        print(
            json.dumps(
                against_transformers(settings, model_dir, name, batch, repeats, new_tokens, prompt_tokens)
            )
        )
        return
    model = build_model(ModelConfig.from_settings(settings.model), seed=settings.model.seed)
    engine_settings = settings.engine.model_copy(
        update={"torch_threads": threads, "max_running_requests": max(BATCH_SIZES)}
    )
    console.print(
        f"model {model.num_parameters():,} parameters, {threads} torch thread(s), "
        f"prompt {prompt_tokens}, {new_tokens} new tokens, {repeats} alternating runs"
    )
    engine = Engine(Path(tempfile.gettempdir()), engine_settings, model=model).start()
    try:
        results = _alternate(engine, model, repeats, new_tokens, prompt_tokens)
    finally:
        engine.stop()
    medians = {b: {side: statistics.median(v) for side, v in sides.items()} for b, sides in results.items()}
    for batch, sides in medians.items():
        console.print(
            f"batch {batch:>3}: engine {sides['engine']:>9,.0f} tok/s   plain {sides['plain']:>9,.0f} tok/s"
            f"   ratio {sides['engine'] / sides['plain']:.2f}"
        )
    figures = {f"tokens_per_s_b{b}": round(medians[b]["engine"], 1) for b in BATCH_SIZES}
    figures |= {f"plain_tokens_per_s_b{b}": round(medians[b]["plain"], 1) for b in BATCH_SIZES}
    figures["ratio"] = round(medians[64]["engine"] / medians[64]["plain"], 3)
    print(json.dumps(figures))


def _alternate(
    engine: Engine, model: PolicyModel, repeats: int, new_tokens: int, prompt_tokens: int
) -> dict[int, dict[str, list[float]]]:
    """Tokens/s of each side per batch size, the sides taking turns `repeats` times after a warm-up."""
    results: dict[int, dict[str, list[float]]] = {b: {"engine": [], "plain": []} for b in BATCH_SIZES}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(BATCH_SIZES) * repeats)
        for batch in BATCH_SIZES:
            batch_prompts = prompts(batch, prompt_tokens, model.config.vocab_size)
            engine_run(engine, batch_prompts, 4)  # warm-up: allocations, first-call overheads
            plain_loop(model, batch_prompts, 4)
            for _ in range(repeats):
                results[batch]["plain"].append(plain_loop(model, batch_prompts, new_tokens))
                results[batch]["engine"].append(engine_run(engine, batch_prompts, new_tokens))
                progress.advance(task)
    return results

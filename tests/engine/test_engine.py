"""The embedded engine core: batching, sampling, logprobs, caps, abort, pause, weight updates."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents.engine.errors import ContextLengthError, EngineRefusal, QueueFullError
from agents.engine.protocol import SamplingParams
from tests.engine.conftest import EngineFactory, wait_until
from trainer.checkpoint import load_model

TIMEOUT = 120


def prompt(length: int, offset: int = 0) -> list[int]:
    return [3 + (offset * 37 + i * 11) % 2000 for i in range(length)]


def full_forward_logprobs(model_dir: Path, input_ids: list[int], output_ids: tuple[int, ...]) -> list[float]:
    model = load_model(model_dir)
    ids = torch.tensor([input_ids + list(output_ids)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids)[0], dim=-1)
    start = len(input_ids) - 1
    return [logprobs[start + i, token].item() for i, token in enumerate(output_ids)]


def test_logprobs_equal_a_full_forward_pass(make_engine: EngineFactory, model_dir: Path) -> None:
    engine = make_engine(prefill_chunk_tokens=64)  # the 150-token prompt is prefilled in 3 chunks
    # Ragged lengths in two buckets; the 50-token prompt outgrows the 64-position bucket and moves.
    prompts = [prompt(n, n) for n in (5, 17, 150, 50)]
    futures = [
        engine.submit(f"r{i}", p, SamplingParams(max_new_tokens=24, seed=i)) for i, p in enumerate(prompts)
    ]
    diffs = []
    for p, future in zip(prompts, futures, strict=True):
        result = future.result(TIMEOUT)
        assert len(result.output_ids) == 24 and result.finish_reason == "length"
        reference = full_forward_logprobs(model_dir, p, result.output_ids)
        diffs += [abs(a - b) for a, b in zip(reference, result.output_logprobs, strict=True)]
    assert sum(diffs) / len(diffs) <= 1e-4


def test_seeded_sampling_is_reproducible_alone_or_batched(make_engine: EngineFactory) -> None:
    engine = make_engine()
    params = SamplingParams(max_new_tokens=16, seed=1234, temperature=1.0)
    alone = engine.submit("alone", prompt(9), params).result(TIMEOUT)
    crowd = [
        engine.submit(f"other{i}", prompt(5 + i, i), SamplingParams(max_new_tokens=20)) for i in range(6)
    ]
    batched = engine.submit("batched", prompt(9), params)
    assert batched.result(TIMEOUT).output_ids == alone.output_ids
    huge_seed = engine.submit("huge", prompt(9), SamplingParams(max_new_tokens=16, seed=2**64 + 1234))
    assert huge_seed.result(TIMEOUT).output_ids  # folded into int64, not an overflow
    other_seed = engine.submit("other-seed", prompt(9), SamplingParams(max_new_tokens=16, seed=4321))
    assert other_seed.result(TIMEOUT).output_ids != alone.output_ids
    for future in crowd:
        future.result(TIMEOUT)


def test_top_k_one_and_tiny_top_p_are_greedy(make_engine: EngineFactory, model_dir: Path) -> None:
    engine = make_engine()

    def run(rid: str, params: SamplingParams) -> tuple[int, ...]:
        return engine.submit(rid, prompt(12), params).result(TIMEOUT).output_ids

    greedy = run("g", SamplingParams(max_new_tokens=10, temperature=0))
    top_k = run("k", SamplingParams(max_new_tokens=10, top_k=1, seed=3))
    top_p = run("p", SamplingParams(max_new_tokens=10, top_p=1e-6, seed=4))
    assert greedy == top_k == top_p
    model = load_model(model_dir)
    ids = torch.tensor([prompt(12) + list(greedy)])
    with torch.no_grad():
        argmax = model(ids)[0, 11:-1].argmax(-1).tolist()
    assert tuple(argmax) == greedy


def test_stop_token_ends_the_request_and_is_returned(make_engine: EngineFactory) -> None:
    engine = make_engine()
    every_token = tuple(range(2048))
    result = engine.submit("s", prompt(6), SamplingParams(max_new_tokens=50, stop_token_ids=every_token))
    done = result.result(TIMEOUT)
    assert done.finish_reason == "stop"
    assert len(done.output_ids) == 1 and done.matched_token == done.output_ids[0]


def test_context_cap_refuses_input_at_the_cap_and_clamps_generation(make_engine: EngineFactory) -> None:
    engine = make_engine(context_length=64)
    with pytest.raises(ContextLengthError, match=r"input \(64 tokens\) is at or over the model's context"):
        engine.submit("at-cap", prompt(64), SamplingParams(max_new_tokens=1))
    with pytest.raises(ContextLengthError):
        engine.submit("over-cap", prompt(100), SamplingParams(max_new_tokens=1))
    clamped = engine.submit("near-cap", prompt(60), SamplingParams(max_new_tokens=1000)).result(TIMEOUT)
    assert clamped.finish_reason == "length"
    assert len(clamped.output_ids) == 4  # 60 + 4 = the cap


def test_bad_input_is_refused_with_a_clear_error(make_engine: EngineFactory) -> None:
    engine = make_engine()
    with pytest.raises(EngineRefusal, match="empty"):
        engine.submit("empty", [], SamplingParams())
    with pytest.raises(EngineRefusal, match=r"token ids in \[0, 2048\)"):
        engine.submit("oov", [5, 99999], SamplingParams())


def test_a_runaway_request_does_not_starve_the_others(make_engine: EngineFactory) -> None:
    engine = make_engine(context_length=2048, max_running_requests=2, kv_cache_tokens=2200)
    runaway = engine.submit("runaway", prompt(1000), SamplingParams(max_new_tokens=10**6, seed=1))
    wait_until(lambda: engine.stats().running >= 1, what="the runaway to start decoding")
    shorts = [engine.submit(f"short{i}", prompt(10, i), SamplingParams(max_new_tokens=8)) for i in range(8)]
    results = [future.result(TIMEOUT) for future in shorts]
    assert all(r.finish_reason == "length" and len(r.output_ids) == 8 for r in results)
    assert not runaway.done(), "the short requests finished while the runaway still ran"
    stats = engine.stats()
    assert stats.reserved_kv_tokens <= stats.kv_cache_tokens
    engine.abort("runaway")
    partial = runaway.result(TIMEOUT)
    assert partial.finish_reason == "abort"
    assert 0 < len(partial.output_ids) < 1048  # clamped to context 2048 - 1000 input


def test_queue_limit_is_enforced(make_engine: EngineFactory) -> None:
    engine = make_engine(max_queued_requests=2)
    engine.pause()
    futures = [engine.submit(f"q{i}", prompt(4), SamplingParams(max_new_tokens=2)) for i in range(2)]
    with pytest.raises(QueueFullError, match="max_queued_requests"):
        engine.submit("q3", prompt(4), SamplingParams(max_new_tokens=2))
    engine.resume()
    assert all(f.result(TIMEOUT).finish_reason == "length" for f in futures)


def test_abort_of_queued_and_running_requests(make_engine: EngineFactory) -> None:
    engine = make_engine(max_running_requests=1)
    running = engine.submit("running", prompt(8), SamplingParams(max_new_tokens=3000))
    queued = engine.submit("queued", prompt(8), SamplingParams(max_new_tokens=5))
    wait_until(lambda: engine.stats().generated_tokens >= 3, what="tokens from the running request")
    assert engine.abort("queued") and engine.abort("running")
    assert not engine.abort("unknown")
    queued_result, running_result = queued.result(TIMEOUT), running.result(TIMEOUT)
    assert queued_result.finish_reason == "abort" and queued_result.output_ids == ()
    assert running_result.finish_reason == "abort" and len(running_result.output_ids) >= 3
    assert len(running_result.output_logprobs) == len(running_result.output_ids)


def test_pause_holds_requests_and_continue_resumes_them(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.pause()
    future = engine.submit("held", prompt(8), SamplingParams(max_new_tokens=4))
    wait_until(lambda: engine.stats().queued == 1, what="the request to queue")
    assert not future.done()
    assert engine.stats().paused and engine.stats().generated_tokens == 0
    engine.resume()
    assert future.result(TIMEOUT).finish_reason == "length"
    engine.pause(abort_running=True)
    assert engine.stats().paused


def test_retry_with_the_same_rid_joins_the_request_in_flight(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.pause()
    first = engine.submit("same", prompt(8), SamplingParams(max_new_tokens=4, seed=1))
    assert engine.submit("same", prompt(8), SamplingParams(max_new_tokens=4, seed=1)) is first
    with pytest.raises(EngineRefusal, match="already in flight"):
        engine.submit("same", prompt(9), SamplingParams(max_new_tokens=4, seed=1))
    engine.resume()
    first.result(TIMEOUT)


def test_weight_update_mid_generation_versions_later_tokens(
    make_engine: EngineFactory, model_dir: Path, updated_model_dir: Path
) -> None:
    engine = make_engine()
    future = engine.submit("long", prompt(8), SamplingParams(max_new_tokens=4000, seed=2))
    wait_until(lambda: engine.stats().generated_tokens >= 5, what="tokens under version 0")
    engine.update_weights(updated_model_dir).result(TIMEOUT)
    assert engine.weight_version == 7
    after = engine.stats().generated_tokens
    wait_until(lambda: engine.stats().generated_tokens >= after + 5, what="tokens under version 7")
    engine.abort("long")
    result = future.result(TIMEOUT)
    versions = list(result.output_versions)
    assert versions[0] == 0 and versions[-1] == 7
    assert versions == sorted(versions) and set(versions) == {0, 7}
    assert result.weight_version == 7
    fresh = engine.submit("fresh", prompt(20), SamplingParams(max_new_tokens=8, seed=5)).result(TIMEOUT)
    assert set(fresh.output_versions) == {7}
    reference = full_forward_logprobs(updated_model_dir, prompt(20), fresh.output_ids)
    assert max(abs(a - b) for a, b in zip(reference, fresh.output_logprobs, strict=True)) < 1e-4


def test_zero_max_new_tokens_finishes_at_once(make_engine: EngineFactory) -> None:
    engine = make_engine()
    result = engine.submit("zero", prompt(4), SamplingParams(max_new_tokens=0)).result(TIMEOUT)
    assert result.output_ids == () and result.finish_reason == "length"


def test_length_buckets_bound_the_padding_of_one_long_request(model_dir: Path) -> None:
    import concurrent.futures

    from agents.engine.batch import Decoder, RunningRequest
    from trainer.model import KVCache

    config = load_model(model_dir).config
    decoder = Decoder(config, context_length=4096)

    def add(rid: str, length: int) -> None:
        future: concurrent.futures.Future = concurrent.futures.Future()
        request = RunningRequest(rid, prompt(length), SamplingParams(), 0, 10, 0.0, future)
        request.output_ids.append(5)
        decoder.add(request, KVCache.empty(config, 1, length, torch.float32), length)

    add("long", 3000)
    for i in range(15):
        add(f"short{i}", 20)
    assert sorted(decoder.buckets) == [64, 4096]
    assert decoder.cached_positions() <= 4096 + 16 * 64  # not 16 rows x 4096
    bucket = decoder.buckets[64]
    bucket.lengths[0] = 64  # the next token would not fit: the row moves up
    moved = bucket.requests[0].rid
    decoder.rebucket()
    assert [r.rid for r in decoder.buckets[128].requests] == [moved]
    assert len(decoder) == 16
    assert [r.rid for r in decoder.remove_where({"long"})] == ["long"]
    assert sorted(decoder.buckets) == [64, 128]


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agents.engine.errors import EngineFailure

    engine = make_engine()

    def out_of_memory(*args: object) -> torch.Tensor:
        raise RuntimeError("out of memory")

    engine.pause()
    monkeypatch.setattr(engine.model, "forward_cached", out_of_memory)
    doomed = engine.submit("doomed", prompt(8), SamplingParams(max_new_tokens=4))
    engine.resume()
    with pytest.raises(EngineFailure, match="out of memory"):
        doomed.result(TIMEOUT)
    monkeypatch.undo()
    assert engine.submit("fine", prompt(8), SamplingParams(max_new_tokens=4)).result(TIMEOUT).output_ids

"""The embedded engine: continuous batching over a KV cache, in one scheduler thread.

Callers (the HTTP server, tests, the benchmark) call `submit`, `abort`, `pause`,
`resume` and `update_weights` from any thread; the scheduler thread owns the model
and every running request and applies those calls between steps. Each step:

1. apply aborts (the partial output comes back with finish reason "abort"; once `stop`
   is called every request fails with `EngineStopping` instead);
2. admit queued requests while fewer than `max_running_requests` run and their
   reserved tokens (input + max_new_tokens) fit in `kv_cache_tokens`; an admitted
   prompt starts from the longest prefix in the prefix cache (earlier turns);
3. prefill: at most `prefill_chunk_tokens` prompt tokens, so a long prompt is spread
   over several steps instead of stalling every decoding request;
4. decode: one batched forward per length bucket over all decoding requests, one
   token each (`batch.Decoder`: padding is bounded, a long request costs its length).

Context cap (`context_length`): input at or over the cap is refused with
`ContextLengthError`; `max_new_tokens` is clamped to what the cap leaves, and a
request that reaches it finishes with "length". Together with the KV budget and
the admission queue this bounds what one runaway request can take from the others.

Every token records the weight version that produced it; `update_weights` swaps the
model between two steps, so tokens after it carry the new version.
"""

from __future__ import annotations

import concurrent.futures
import logging
import random
import threading
import time
from collections import deque
from pathlib import Path

import torch

from agents.engine.batch import (
    DecodeBatch,
    Decoder,
    EngineResult,
    RunningRequest,
    TokenListener,
    request_sampling,
)
from agents.engine.errors import (
    EngineFailure,
    EngineRefusal,
    EngineStopping,
    QueueFullError,
    check_input,
)
from agents.engine.prefill import Prefilled, prefill_step
from agents.engine.prefix_cache import PrefixCache
from agents.engine.protocol import FinishReason, SamplingParams
from agents.engine.sampling import sample_with_alternatives
from agents.engine.stats import EngineStats
from agents.settings import EngineSettings
from trainer.checkpoint import TORCH_DTYPES, load_model, weight_version
from trainer.model import KVCache, PolicyModel

logger = logging.getLogger(__name__)


class Engine:
    def __init__(self, model_dir: Path, settings: EngineSettings, model: PolicyModel | None = None) -> None:
        self.settings = settings
        self.model_dir = Path(model_dir)
        self.dtype = TORCH_DTYPES[settings.dtype]
        self.model = model if model is not None else load_model(self.model_dir, self.dtype)
        self.weight_version = weight_version(self.model_dir) if model is None else 0
        self._lock = threading.Condition()
        self._queue: deque[RunningRequest] = deque()
        self._prefilling: list[RunningRequest] = []
        self._decoding = Decoder(self.model.config, settings.context_length, self.model.dtype)
        self._by_rid: dict[str, RunningRequest] = {}
        self._aborts: set[str] = set()
        self._prefix = PrefixCache(settings.prefix_cache_tokens, settings.prefix_block_tokens)
        self._flush_requested = False
        self._pending_model: tuple[PolicyModel, int, concurrent.futures.Future[int]] | None = None
        self._paused = False
        self._stopping = False
        self._seeds = random.Random(settings.seed)
        self._decode_steps = 0
        self._generated = 0
        self._thread = threading.Thread(target=self._run, name="engine-scheduler", daemon=True)

    # ---- public API (any thread) ----
    def start(self) -> Engine:
        if self.settings.torch_threads > 0:
            torch.set_num_threads(self.settings.torch_threads)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._aborts.update(self._by_rid)
            self._lock.notify_all()
        self._thread.join(timeout=30)

    def submit(
        self,
        rid: str,
        input_ids: list[int],
        params: SamplingParams,
        listener: TokenListener | None = None,
    ) -> concurrent.futures.Future[EngineResult]:
        """Queue a request. A retry with the same rid and input joins the request already in flight
        (a joining `listener` is not called: the joined request's tokens come with its result).
        `listener` (streaming) is called from the scheduler thread with each token as it is sampled."""
        cap = self.settings.context_length
        check_input(input_ids, cap, self.model.config.vocab_size)
        with self._lock:
            if self._stopping:
                raise EngineStopping("the engine is shutting down: send the request again")
            existing = self._by_rid.get(rid)
            if existing is not None:
                if existing.same_request(input_ids, params):
                    return existing.future
                raise EngineRefusal(f"request id {rid!r} is already in flight with different input")
            if len(self._queue) >= self.settings.max_queued_requests:
                raise QueueFullError(
                    f"engine queue is full ({self.settings.max_queued_requests} requests): retry later "
                    f"or raise engine.max_queued_requests"
                )
            # Any int is a valid seed; it is folded into int64 for the sampling hash.
            seed = params.seed % (1 << 63) if params.seed is not None else self._seeds.getrandbits(63)
            request = RunningRequest(
                rid=rid,
                input_ids=list(input_ids),
                params=params,
                seed=seed,
                max_new_tokens=min(params.max_new_tokens, cap - len(input_ids)),
                arrival=time.monotonic(),
                future=concurrent.futures.Future(),
                listener=listener,
            )
            if request.max_new_tokens == 0:
                request.future.set_result(request.result("length", self.weight_version, time.monotonic()))
                return request.future
            self._by_rid[rid] = request
            self._queue.append(request)
            self._lock.notify_all()
            return request.future

    def abort(self, rid: str) -> bool:
        """Abort one request (queued or running); False when no such request is in flight."""
        with self._lock:
            if rid not in self._by_rid:
                return False
            self._aborts.add(rid)
            self._lock.notify_all()
            return True

    def abort_all(self) -> int:
        with self._lock:
            self._aborts.update(self._by_rid)
            self._lock.notify_all()
            return len(self._by_rid)

    def pause(self, abort_running: bool = False) -> None:
        """Stop stepping (requests stay where they are); with abort_running, abort them first."""
        with self._lock:
            if abort_running:
                self._aborts.update(self._by_rid)
            self._paused = True
            self._lock.notify_all()

    def flush_cache(self) -> None:
        """Drop the prefix cache (applied before the next step)."""
        with self._lock:
            self._flush_requested = True
            self._lock.notify_all()

    def resume(self) -> None:
        with self._lock:
            self._paused = False
            self._lock.notify_all()

    def update_weights(self, model_dir: Path, version: int | None = None) -> concurrent.futures.Future[int]:
        """Load weights (in the caller's thread) and swap them in between two steps.

        The future resolves to the new weight version once the swap happened."""
        model = load_model(Path(model_dir), self.dtype)
        if model.config != self.model.config:
            raise EngineRefusal(f"{model_dir} has a different architecture than the served model")
        new_version = version if version is not None else weight_version(Path(model_dir))
        done: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            self._pending_model = (model, new_version, done)
            self._lock.notify_all()
        return done

    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                running=len(self._decoding),
                prefilling=len(self._prefilling),
                queued=len(self._queue),
                reserved_kv_tokens=self._reserved(),
                kv_cache_tokens=self.settings.kv_cache_tokens,
                cached_kv_positions=self._decoding.cached_positions(),
                prefix_cache_tokens=self._prefix.tokens,
                prefix_hits=self._prefix.hits,
                prefix_hit_tokens=self._prefix.hit_tokens,
                weight_version=self.weight_version,
                paused=self._paused,
                decode_steps=self._decode_steps,
                generated_tokens=self._generated,
            )

    # ---- scheduler thread ----
    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._lock:
                    while not self._stopping and not self._has_control_work() and not self._can_step():
                        self._lock.wait()
                    if self._stopping and not self._by_rid:
                        return
                    self._apply_control()
                    step = self._can_step()
                    if step:
                        self._admit()
                if step:
                    try:
                        self._step()
                    except Exception as error:
                        logger.exception("engine step failed; failing the requests in it")
                        self._fail_in_flight(error)

    def _has_control_work(self) -> bool:
        return bool(self._aborts) or self._pending_model is not None or self._flush_requested

    def _can_step(self) -> bool:
        return not self._paused and bool(self._queue or self._prefilling or len(self._decoding))

    def _apply_control(self) -> None:
        if self._pending_model is not None:
            model, version, done = self._pending_model
            self.model, self.weight_version, self._pending_model = model, version, None
            self._prefix.clear()  # keys/values of the old weights
            done.set_result(version)
        if self._flush_requested:
            self._prefix.clear()
            self._flush_requested = False
        if self._aborts:
            self._apply_aborts()

    def _apply_aborts(self) -> None:
        """Aborted requests finish with reason "abort" and what they generated; on `stop` every
        request in flight fails with `EngineStopping` instead (a restart is not an abort)."""
        now = time.monotonic()
        aborted = self._retire(self._aborts)
        aborted += [r for r in self._prefilling if r.rid in self._aborts]
        aborted += [r for r in self._queue if r.rid in self._aborts]
        self._prefilling = [r for r in self._prefilling if r.rid not in self._aborts]
        self._queue = deque(r for r in self._queue if r.rid not in self._aborts)
        self._aborts.clear()
        for request in aborted:
            if self._stopping:
                self._fail(request, EngineStopping("the engine stopped before the request finished"))
            else:
                self._finish(request, "abort", now)

    def _reserved(self) -> int:
        return sum(r.reserved_tokens for r in self._decoding.requests()) + sum(
            r.reserved_tokens for r in self._prefilling
        )

    def _admit(self) -> None:
        if not self._queue:
            return
        reserved = self._reserved()
        while self._queue:
            running = len(self._decoding) + len(self._prefilling)
            request = self._queue[0]
            fits = reserved + request.reserved_tokens <= self.settings.kv_cache_tokens
            if running >= self.settings.max_running_requests or (running and not fits):
                return
            self._queue.popleft()
            request.admitted = time.monotonic()
            reserved += request.reserved_tokens
            self._attach_prefix(request)
            self._prefilling.append(request)

    def _attach_prefix(self, request: RunningRequest) -> None:
        """Start the prompt's prefill from the longest cached prefix, if any."""
        hit = self._prefix.lookup(request.input_ids)
        if hit is None:
            return
        entry, matched = hit
        cache = KVCache.empty(self.model.config, 1, len(request.input_ids), self.model.dtype)
        for layer in range(self.model.config.num_layers):
            cache.keys[layer][0, :, :matched] = entry.keys[layer][:, :matched]
            cache.values[layer][0, :, :matched] = entry.values[layer][:, :matched]
        request.prefill_cache, request.prefilled, request.cached_tokens = cache, matched, matched

    def _retire(self, rids: set[str]) -> list[RunningRequest]:
        """Remove decoding requests, keeping their keys/values in the prefix cache."""
        for request, view, length in self._decoding.rows_of(rids):
            self._prefix.insert(request.input_ids + request.output_ids, view, length)
        return self._decoding.remove_where(rids)

    def _finish(self, request: RunningRequest, reason: FinishReason, now: float) -> None:
        self._by_rid.pop(request.rid, None)
        request.prefill_cache = None
        if not request.future.done():
            request.future.set_result(request.result(reason, self.weight_version, now))

    def _fail(self, request: RunningRequest, error: Exception) -> None:
        self._by_rid.pop(request.rid, None)
        request.prefill_cache = None
        if not request.future.done():
            request.future.set_exception(error)

    def _fail_in_flight(self, error: Exception) -> None:
        with self._lock:
            failed = self._decoding.requests() + self._prefilling
            self._decoding = Decoder(self.model.config, self.settings.context_length, self.model.dtype)
            self._prefilling = []
            for request in failed:
                self._fail(request, EngineFailure(f"engine step failed: {error!r}"))

    def _step(self) -> None:
        """One prefill chunk budget plus one decode step. Runs without the lock: only this thread
        touches running requests; other threads only append to the queue under the lock."""
        model, version = self.model, self.weight_version
        finished: list[tuple[RunningRequest, FinishReason]] = []
        finished += self._prefill(model, version)
        if len(self._decoding):
            self._decoding.rebucket()
            for bucket in list(self._decoding.buckets.values()):
                finished += self._decode(bucket, model, version)
            if finished:
                self._retire({request.rid for request, _ in finished})
        if finished:
            now = time.monotonic()
            with self._lock:
                for request, reason in finished:
                    self._finish(request, reason, now)

    def _prefill(self, model: PolicyModel, version: int) -> list[tuple[RunningRequest, FinishReason]]:
        completed = prefill_step(model, self._prefilling, self.settings.prefill_chunk_tokens)
        return self._start_decoding(completed, version) if completed else []

    def _start_decoding(
        self, completed: list[Prefilled], version: int
    ) -> list[tuple[RunningRequest, FinishReason]]:
        """Sample each completed prompt's first token and move it into the decode batch."""
        requests = [request for request, _, _ in completed]
        with self._lock:
            self._prefilling = [r for r in self._prefilling if r not in requests]
        sampling = request_sampling(requests, [0] * len(requests))
        sampled = sample_with_alternatives(torch.stack([logits for _, logits, _ in completed]), sampling)
        finished: list[tuple[RunningRequest, FinishReason]] = []
        top = sampled.top or ((),) * len(completed)
        drawn = zip(completed, sampled.tokens.tolist(), sampled.logprobs.tolist(), top, strict=True)
        for (request, _, cache), token, logprob, alternatives in drawn:
            self._generated += 1
            reason = request.append(token, logprob, version, alternatives)
            if reason is not None:
                finished.append((request, reason))
            else:
                self._decoding.add(request, cache, len(request.input_ids))
            request.prefill_cache = None
        return finished

    def _decode(
        self, bucket: DecodeBatch, model: PolicyModel, version: int
    ) -> list[tuple[RunningRequest, FinishReason]]:
        """One decode step over one bucket; finished requests are returned, not yet removed."""
        tokens, start, cache, sampling = bucket.prepare_step()
        logits = model.forward_cached(tokens, start, cache)[:, -1]
        sampled = sample_with_alternatives(logits, sampling)
        bucket.finish_step()
        self._decode_steps += 1
        self._generated += len(bucket)
        finished: list[tuple[RunningRequest, FinishReason]] = []
        top = sampled.top or ((),) * len(bucket)
        drawn = zip(bucket.requests, sampled.tokens.tolist(), sampled.logprobs.tolist(), top, strict=True)
        for request, token, logprob, alternatives in drawn:
            reason = request.append(token, logprob, version, alternatives)
            if reason is not None:
                finished.append((request, reason))
        return finished

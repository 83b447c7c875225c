#!/usr/bin/env bash
# GPU smoke test of the megatron backend and an SGLang engine (never run by CI; needs a GPU machine).
#
# What it does, each step failing loudly:
#   1. a small model directory (HF layout, random weights, version 0);
#   2. under torchrun (one process): MegatronBackend (megatron-core GPTModel, Transformer Engine spec)
#      loaded through trainer.megatron_convert; its logprobs against PolicyModel's on the same GPU;
#      one RL step (trainer.step.rl_step, the loss of trainer.loss); weights must move;
#   3. one weight publish: version 1 as an HF directory via megatron_to_hf (trainer.publish.write_version,
#      checksummed with trainer.versions.directory_sha256);
#   4. an SGLang server on the version-0 directory; the version-1 directory verified against its checksum,
#      loaded with POST /update_weights_from_disk {"model_path", "weight_version": "1"};
#   5. one /generate (our client's request body and parser): the answer must report weight version 1, and
#      the engine's logprobs are compared with the trainer's (PolicyModel of version 1).
#
# Prerequisites (checked below): an NVIDIA (CUDA) or AMD (ROCm) GPU visible to torch; `pip install '.[gpu]'`
# (megatron-core, sglang) and Transformer Engine for this CUDA/ROCm in the Python at $PYTHON; torchrun.
# Settings (environment): PYTHON (default .venv/bin/python), WORK (default a new temp dir, kept),
# SGLANG_PORT (default 30123), SGLANG_ARGS (extra server flags), SGLANG_START_S (default 600),
# MAX_LOGPROB_GAP (default 0.05: mean |trainer - engine| per token; bf16 engines sit near 0.01),
# MEGATRON_MAX_LOGPROB_GAP (default 1e-3: max |megatron - PolicyModel| per token, both fp32).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="${WORK:-$(mktemp -d -t rollstream-gpu-smoke-XXXXXX)}"
SGLANG_PORT="${SGLANG_PORT:-30123}"
SGLANG_ARGS="${SGLANG_ARGS:---mem-fraction-static 0.3 --disable-cuda-graph}"
SGLANG_START_S="${SGLANG_START_S:-600}"
export MAX_LOGPROB_GAP="${MAX_LOGPROB_GAP:-0.05}" MEGATRON_MAX_LOGPROB_GAP="${MEGATRON_MAX_LOGPROB_GAP:-1e-3}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" WORK SGLANG_PORT

die() { echo "gpu_smoke: FAILED: $*" >&2; exit 1; }
step() { echo "gpu_smoke: == $*"; }

step "prerequisites"
[ -x "$PYTHON" ] || die "no Python at $PYTHON (set PYTHON=...)"
command -v curl > /dev/null || die "curl not found (used to wait for SGLang's /health)"
"$PYTHON" - <<'EOF' || die "prerequisites missing (see above); this script runs only on a GPU machine"
import importlib, sys, torch
missing = [m for m in ("megatron.core", "transformer_engine.pytorch", "sglang") if importlib.util.find_spec(m.split(".")[0]) is None]
if missing:
    sys.exit(f"not installed: {missing}: pip install '.[gpu]' and Transformer Engine for this CUDA/ROCm")
if not torch.cuda.is_available():
    sys.exit("torch sees no GPU (CUDA, or ROCm's HIP devices, which torch also calls cuda)")
build = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
print(f"torch {torch.__version__} ({build}), device {torch.cuda.get_device_name(0)}")
EOF
TORCHRUN="$(dirname "$PYTHON")/torchrun"
[ -x "$TORCHRUN" ] || die "torchrun not found beside $PYTHON"
echo "work dir: $WORK"

step "1. base model directory (version 0)"
"$PYTHON" - <<'EOF' || die "could not create the base model"
import os
from pathlib import Path
from trainer.checkpoint import init_model_dir
from trainer.settings import ModelSettings
# head_dim 64: a size every SGLang attention backend serves.
settings = ModelSettings(vocab_size=2048, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=704, max_position=4096, seed=1)
init_model_dir(settings, Path(os.environ["WORK"]) / "base")
EOF

step "2+3. megatron step and weight publish (torchrun, one process)"
cat > "$WORK/megatron_step.py" <<'EOF'
import json, os
from array import array
from pathlib import Path
import torch
from trainer.batch import TrainSample
from trainer.checkpoint import load_model
from trainer.loss import next_token_logprobs
from trainer.megatron_backend import MegatronBackend
from trainer.publish import write_version
from trainer.settings import TrainerSettings

work = Path(os.environ["WORK"])
policy = load_model(work / "base")
settings = TrainerSettings(backend="megatron", device="cuda", lr=1e-4, micro_batch_tokens=512)
backend = MegatronBackend(policy, settings, lr=settings.lr)
ids = torch.randint(0, policy.config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    ours = next_token_logprobs(policy.to(backend.device)(ids.to(backend.device)), ids.to(backend.device))
    theirs = next_token_logprobs(backend.model(ids.to(backend.device)), ids.to(backend.device))
gap = float((ours - theirs).abs().max())
print(f"megatron vs PolicyModel, same weights: max |dlogprob| {gap:.3e}")
assert gap <= float(os.environ["MEGATRON_MAX_LOGPROB_GAP"]), "the GPTModel does not compute what PolicyModel does"
before = backend.hf_state_dict()
samples = [
    TrainSample(group_id="g", trajectory_id=f"t{row}", token_ids=array("i", ids[row].tolist()),
                loss_mask=array("b", [0] * 48 + [1] * 48), rollout_logprobs=array("d", [0.0] + theirs[row].tolist()),
                token_versions=array("i", [0] * 96), advantage=advantage, reward=float(advantage > 0))
    for row, advantage in enumerate((1.0, -1.0))
]
metrics = backend.rl_step(samples)
print("rl_step:", metrics)
assert metrics.tokens == 192 and torch.isfinite(torch.tensor(metrics.loss)) and metrics.grad_norm > 0
after = backend.hf_state_dict()
moved = max(float((after[k] - before[k]).abs().max()) for k in before)
assert moved > 0, "the RL step did not change the weights"
published = write_version(after, policy.config, base_dir=work / "base", weights_dir=work / "weights",
                          run_id="smoke", version=1)
(work / "published.json").write_text(json.dumps({"path": str(published.path), "checksum": published.checksum}))
print(f"published version 1 at {published.path} sha256 {published.checksum[:12]}… (max weight change {moved:.2e})")
EOF
"$TORCHRUN" --standalone --nproc-per-node 1 "$WORK/megatron_step.py" || die "the megatron step or the publish failed"

step "4. SGLang on version 0, then /update_weights_from_disk to version 1"
# shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
"$PYTHON" -m sglang.launch_server --model-path "$WORK/base" --host 127.0.0.1 --port "$SGLANG_PORT" \
    $SGLANG_ARGS > "$WORK/sglang.log" 2>&1 &
SGLANG_PID=$!
trap 'kill "$SGLANG_PID" 2>/dev/null || true; wait "$SGLANG_PID" 2>/dev/null || true' EXIT
for _ in $(seq "$SGLANG_START_S"); do
    kill -0 "$SGLANG_PID" 2>/dev/null || { tail -50 "$WORK/sglang.log" >&2; die "SGLang exited while starting"; }
    curl -sf "http://127.0.0.1:$SGLANG_PORT/health" > /dev/null && break
    sleep 1
done
curl -sf "http://127.0.0.1:$SGLANG_PORT/health" > /dev/null || die "SGLang not healthy after ${SGLANG_START_S}s"

step "5. load version 1 and generate"
"$PYTHON" - <<'EOF' || { tail -50 "$WORK/sglang.log" >&2; die "SGLang did not serve version 1"; }
import json, os
from pathlib import Path
import httpx, torch
from agents.engine.client import parse_generation, request_body
from agents.engine.protocol import SamplingParams
from trainer.checkpoint import load_model
from trainer.loss import next_token_logprobs
from trainer.versions import verify_directory

work, url = Path(os.environ["WORK"]), f"http://127.0.0.1:{os.environ['SGLANG_PORT']}"
published = json.loads((work / "published.json").read_text())
verify_directory(Path(published["path"]), published["checksum"])
answer = httpx.post(f"{url}/update_weights_from_disk", timeout=600,
                    json={"model_path": published["path"], "weight_version": "1"}).json()
assert answer.get("success"), f"/update_weights_from_disk refused version 1: {answer}"
prompt = list(range(10, 42))
body = request_body(prompt, SamplingParams(max_new_tokens=16, temperature=1.0, seed=0), rid="smoke-1")
generation = parse_generation(httpx.post(f"{url}/generate", json=body, timeout=120).json(), "sglang", len(prompt))
print("generation:", generation)
assert generation.weight_version == 1, f"SGLang reports weight version {generation.weight_version}, not 1"
tokens = torch.tensor([prompt + list(generation.output_ids)])
with torch.no_grad():
    trainer = next_token_logprobs(load_model(Path(published["path"]))(tokens), tokens)[0, len(prompt) - 1 :]
gap = float((trainer - torch.tensor(generation.output_logprobs)).abs().mean())
print(f"engine vs trainer logprobs (version 1): mean |d| {gap:.4f} over {len(generation.output_ids)} tokens")
assert gap <= float(os.environ["MAX_LOGPROB_GAP"]), "the engine does not serve the weights the trainer wrote"
EOF
step "OK: megatron step, publish, SGLang load of version 1 and generate all passed (work dir $WORK)"

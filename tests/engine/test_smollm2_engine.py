"""SmolLM2-135M-Instruct (the real pretrained model, `rollstream model get`) in our model and engine:
the logits of transformers, the perplexity and the greedy answer measured, in fp32 and bf16, and an
episode's context rendered by its own chat template."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agents.chat import ChatFormat
from agents.conversation import Conversation
from agents.engine.engine import Engine
from agents.engine.protocol import SamplingParams
from agents.settings import EngineSettings
from trainer.checkpoint import load_model

from ..trainer.test_smollm2 import PARAGRAPH, PERPLEXITY_BOUND

pytestmark = pytest.mark.slow
# Measured with transformers' generate on the same directory (tests/trainer/test_smollm2.py) and here.
ANSWER = "The capital of France is Paris."


def test_our_logits_and_perplexity_are_transformers(smollm2: Path) -> None:
    from transformers import LlamaForCausalLM

    chat = ChatFormat.from_model_dir(smollm2)
    ids = torch.tensor([chat.encode(PARAGRAPH)])
    ours = load_model(smollm2)
    theirs = LlamaForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    with torch.no_grad():
        logits, expected = ours(ids), theirs(ids).logits
    assert (logits - expected).abs().max() <= 1e-4
    loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
    assert math.exp(loss.item()) < PERPLEXITY_BOUND


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engine_answers_as_measured_and_stops_at_the_turn_end(smollm2: Path, dtype: str) -> None:
    chat = ChatFormat.from_model_dir(smollm2)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = chat.encode(chat.template.render(messages, add_generation_prompt=True))
    engine = Engine(smollm2, EngineSettings(dtype=dtype, context_length=512)).start()
    try:
        params = SamplingParams(max_new_tokens=16, temperature=0.0, stop_token_ids=chat.stop_token_ids)
        result = engine.submit("capital", prompt, params).result(timeout=300)
    finally:
        engine.stop()
    assert result.finish_reason == "stop" and result.output_ids[-1] == 2  # <|im_end|>, not <|im_start|>
    assert chat.reply_text(result.output_ids) == ANSWER


def test_an_episode_context_is_what_its_template_renders(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    chat = ChatFormat.from_model_dir(smollm2)
    conversation = Conversation.start(chat, "You fix bugs in a shell.", "Fix lib.py.")
    for reply, observed in (
        ("```bash\npython3 run_tests.py\n```", "lib.py:3: return a < b\n"),
        ("done", "ok"),
    ):
        conversation.add_output([*chat.encode(reply), *chat.turn_end])
        conversation.add_observation(observed)
    theirs = AutoTokenizer.from_pretrained(smollm2)
    rendered = theirs.apply_chat_template(conversation.messages, tokenize=False, add_generation_prompt=True)
    assert chat.decode_exact(conversation.ids) == rendered
    assert conversation.drift() is None

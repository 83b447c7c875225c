"""Episodes with a model's own chat template, token in and token out, against `transformers`.

For each template (ChatML, SmolLM2's own, a Llama-3-style header template, and one that strips
earlier assistant reasoning as Qwen3's does) a conversation is built the way an episode builds
it: the prompt rendered once, each assistant turn the "engine's" ids exactly, each observation
appended. The decoded context must equal `apply_chat_template` of the same messages (rendered
by transformers from the same directory), or `render_drift` must say where and why not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import AddedToken

from agents.chat import ChatFormat
from agents.conversation import Conversation
from trainer.checkpoint import CHAT_TEMPLATE
from trainer.tokenizer import save_tokenizer, train_tokenizer

EXTRA_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

# SmolLM2-135M-Instruct's template, as its GGUF carries it (a default system prompt when none is given).
SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
    "trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim }}"
    "{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# Qwen3's rule, reduced: an assistant message before the last user message loses its <think> part.
STRIP_REASONING = (
    "{% set ns = namespace(last_user=0) %}{% for m in messages %}{% if m['role'] == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% for m in messages %}{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\n' + content + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEMPLATES = {
    "chatml": CHAT_TEMPLATE,
    "smollm2": SMOLLM2,
    "llama3": LLAMA3,
    "strip-reasoning": STRIP_REASONING,
}
TURN_END = {
    "chatml": "<|im_end|>",
    "smollm2": "<|im_end|>",
    "llama3": "<|eot_id|>",
    "strip-reasoning": "<|im_end|>",
}

REPLIES = [
    "<think>the tests say which line</think>\nTHOUGHT: run the tests.\n\n```bash\npython3 run_tests.py\n```",
    "THOUGHT: fix it.\n\n```bash\nsed -i 's/ < / <= /' lib.py\n```",
]
OBSERVATIONS = ["<returncode>1</returncode>\n<output>\nlib.py:3: return a < b\n</output>", "ok \n"]


def model_dir(tmp_path: Path, template: str, eos_token: str = "<|im_end|>", eos_ids: object = None) -> Path:
    """A directory with our trained tokenizer (plus Llama-3's header tokens) and `template`."""
    tokenizer = train_tokenizer(1024)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in EXTRA_SPECIALS])
    save_tokenizer(tokenizer, tmp_path)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": eos_token,
        "chat_template": template,
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    if eos_ids is None:
        eos_ids = tokenizer.token_to_id("<|eot_id|>" if "eot_id" in template else "<|im_end|>")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 0}))
    return tmp_path


def converse(chat: ChatFormat) -> Conversation:
    """An episode's context: the prompt, then per turn the engine's ids and the observation."""
    conversation = Conversation.start(chat, "You fix bugs.", "Fix lib.py.")
    for reply, observation in zip(REPLIES, OBSERVATIONS, strict=True):
        output = [*chat.encode(reply), *chat.turn_end]
        conversation.add_output(output)
        assert conversation.pieces[-1] == output  # the engine's ids exactly
        conversation.add_observation(observation)
    return conversation


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_context_is_what_transformers_renders_or_the_drift_says_where(name: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    chat = ChatFormat.from_model_dir(model_dir(tmp_path, TEMPLATES[name]))
    assert chat.decode_exact(chat.turn_end) == TURN_END[name]
    conversation = converse(chat)
    theirs = AutoTokenizer.from_pretrained(tmp_path)
    rendered = theirs.apply_chat_template(conversation.messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = theirs.apply_chat_template(
        conversation.messages[:2], tokenize=True, add_generation_prompt=True
    )
    assert conversation.prompt == list(getattr(prompt_ids, "input_ids", prompt_ids))
    seen = chat.decode_exact(conversation.ids)
    drift = conversation.drift()
    if name == "strip-reasoning":
        # the template drops the first turn's reasoning on a re-render: recorded, not hidden
        assert seen != rendered
        assert drift is not None and drift.turn == 1
        assert drift.seen.startswith("<think>") and not drift.rendered.startswith("<think>")
        assert seen[: drift.offset] == rendered[: drift.offset]
    elif name == "llama3":
        # Llama 3 trims each message: the observation "ok \n" is trimmed as the template renders it,
        # so the context matches; only the engine's own reply would differ if it ended in whitespace.
        assert seen == rendered and drift is None
    else:
        assert seen == rendered and drift is None


def test_stop_tokens_come_from_generation_config_and_the_template_not_the_tokenizer(tmp_path: Path) -> None:
    """SmolLM2's tokenizer may convert with eos_token <|im_start|>: we stop on <|im_end|> (the template's
    turn end) and the generation config's ids, never on the tokenizer's eos name."""
    directory = model_dir(tmp_path, SMOLLM2, eos_token="<|im_start|>", eos_ids=[2])
    chat = ChatFormat.from_model_dir(directory)
    im_start, im_end = chat.tokenizer.token_to_id("<|im_start|>"), chat.tokenizer.token_to_id("<|im_end|>")
    assert chat.stop_token_ids == (im_end,)
    assert im_start not in chat.stop_token_ids


def test_a_reply_cut_by_the_length_cap_is_closed_before_the_observation(tmp_path: Path) -> None:
    chat = ChatFormat.from_model_dir(model_dir(tmp_path, LLAMA3))
    cut = chat.observation(chat.encode("THOUGHT: half a rep"), "out")
    assert chat.decode_exact(cut).startswith("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nout")
    whole = chat.observation([*chat.encode("done"), *chat.turn_end], "out")
    assert chat.decode_exact(whole).startswith("<|start_header_id|>user")


@pytest.mark.parametrize("stopped", [True, False], ids=["stop-token", "length-cap"])
def test_a_context_that_ends_in_an_output_is_no_drift(stopped: bool, tmp_path: Path) -> None:
    """An episode that ends right after a generation has not closed that message yet: the re-render
    closes it, which is not a difference in what the engine saw."""
    chat = ChatFormat.from_model_dir(model_dir(tmp_path, SMOLLM2))
    conversation = Conversation.start(chat, "You fix bugs.", "Fix lib.py.")
    conversation.add_output([*chat.encode(REPLIES[1]), *(chat.turn_end if stopped else ())])
    assert conversation.drift() is None

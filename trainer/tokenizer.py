"""The tokenizer: byte-level BPE trained here, on a small built-in corpus.

No weights or vocabularies can be downloaded, so the tokenizer is trained locally with
`tokenizers` on Python source from the standard library (a fixed list of modules) plus
the shell snippets an agent types. Byte-level pre-tokenisation means every string
round-trips, whatever the corpus. Training is deterministic for a given corpus, and the
result is saved as `tokenizer.json` in the model directory, so the tokenizer of a model
never changes after `init_model_dir`.

Special tokens (ids 0, 1, 2 in this order): `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TOKENIZER_FILE = "tokenizer.json"

# Modules chosen for variety (classes, string handling, tests, CLI code); all are pure Python.
CORPUS_MODULES = (
    "argparse.py",
    "dataclasses.py",
    "difflib.py",
    "functools.py",
    "json/decoder.py",
    "json/encoder.py",
    "pathlib/__init__.py",
    "pathlib.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
    "unittest/case.py",
    "subprocess.py",
    "configparser.py",
    "fractions.py",
)

SHELL_SNIPPETS = """\
ls -la
cd /testbed && git status
git diff
cat README.md
grep -rn "def main" src/ | head -20
find . -name "*.py" -not -path "./.venv/*" | xargs wc -l
sed -n '1,80p' src/package/module.py
python -m pytest -x -q tests/
python -c "import sys; print(sys.version)"
pip install -e .
echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT
cat <<'EOF' > fix.patch
EOF
applypatch() { git apply --whitespace=nowarn "$1"; }
"""

CHAT_SNIPPETS = f"""\
{IM_START}system
You are a helpful assistant that can interact with a computer shell.{IM_END}
{IM_START}user
Please solve this issue. Reply with exactly one ```bash block.{IM_END}
{IM_START}assistant
THOUGHT: let me look at the repository first.

```bash
ls -la
```{IM_END}
"""


def corpus() -> list[str]:
    """The training texts, in a fixed order. Missing modules are skipped (other Python versions)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [SHELL_SNIPPETS, CHAT_SNIPPETS]
    for name in CORPUS_MODULES:
        path = stdlib / name
        if path.is_file():
            texts.append(path.read_text(encoding="utf-8"))
    return texts


def train_tokenizer(vocab_size: int, texts: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer of exactly `vocab_size` tokens or fewer (if the corpus runs out)."""
    minimum = len(SPECIAL_TOKENS) + 256
    if vocab_size < minimum:
        raise ValueError(f"vocab_size {vocab_size} is too small: byte-level BPE needs at least {minimum}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts if texts is not None else corpus(), trainer=trainer)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, model_dir: Path) -> Path:
    path = Path(model_dir) / TOKENIZER_FILE
    tokenizer.save(str(path))
    return path


def load_tokenizer(model_dir: Path) -> Tokenizer:
    path = Path(model_dir) / TOKENIZER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: create the model first with `rollstream model init`")
    return Tokenizer.from_file(str(path))


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    missing = [token for token, value in ids.items() if value is None]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}")
    return {token: int(value) for token, value in ids.items()}

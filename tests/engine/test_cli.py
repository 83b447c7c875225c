"""`rollstream model init/info` and `rollstream engine serve` as a user runs them."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from typer.testing import CliRunner

from rollstream.commands.model import app as model_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flat(output: str) -> str:
    """Rich wraps long lines to the terminal width."""
    return " ".join(output.split())


def test_model_init_and_info(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "model"
    sizes = ["-s", "model.hidden_size=64", "-s", "model.intermediate_size=176", "-s", "model.vocab_size=512"]
    created = runner.invoke(model_app, ["init", "--out", str(out), *sizes])
    assert created.exit_code == 0, created.output
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    shown = runner.invoke(model_app, ["info", "--out", str(out)])
    assert shown.exit_code == 0 and "weight version 0" in shown.output and "512 tokens" in shown.output
    again = runner.invoke(model_app, ["init", "--out", str(out)])
    assert again.exit_code == 1 and "already holds a model" in flat(again.output)
    missing = runner.invoke(model_app, ["info", "--out", str(tmp_path / "nothing")])
    assert missing.exit_code == 1 and "not a model directory" in flat(missing.output)


def test_engine_serve_answers_generate(model_dir: Path) -> None:
    port = free_port()
    arguments = [
        "engine",
        "serve",
        "--model",
        str(model_dir),
        "--port",
        str(port),
        "--context-length",
        "128",
        "--max-running-requests",
        "4",
    ]
    server = subprocess.Popen(
        [sys.executable, "-c", "from rollstream.cli import app; app()", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, server.stdout.read().decode() if server.stdout else ""
            try:
                with urllib.request.urlopen(f"{url}/get_model_info", timeout=5) as reply:
                    info = json.load(reply)
                break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "engine serve did not come up in 180 s"
                time.sleep(0.5)
        assert info["context_length"] == 128 and info["max_running_requests"] == 4
        body = json.dumps({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}).encode()
        request = urllib.request.Request(f"{url}/generate", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=60) as reply:
            assert len(json.load(reply)["output_ids"]) == 3
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

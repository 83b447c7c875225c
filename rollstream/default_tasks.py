"""The default task set (tests, demo): built deterministically from pinned PyPI sdists.

`ensure_default_tasks(config)` returns `config.tasks_dir`, building it first when its
`recipe.json` is missing or differs from the current recipe (libraries, tasks per
library, seed, builder version). The set is built into a sibling `.partial` directory
and renamed into place, so an interrupted build never leaves a half set behind; a file
lock lets concurrent callers (test sessions, the demo) wait for one build. A
directory that holds tasks but no recipe is the user's own set and is left alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

from rollstream.config import Config
from sandboxes.backends import make_factory
from sandboxes.tasks.build import BuildReport, BuildRequest, ProgressFn, build_from_sdist
from sandboxes.tasks.harbor import TASK_FILE
from sandboxes.tasks.sdist import SdistSpec

RECIPE_FILE = "recipe.json"
BUILDER_VERSION = 4  # bump when the builder's output changes, so old sets are rebuilt
MIN_TASKS = 30
MIN_LIBRARIES = 3


class DefaultTasksError(RuntimeError):
    """The default set could not be built; the message says what failed."""


def recipe(config: Config) -> dict[str, object]:
    settings = config.tasks
    return {
        "libraries": list(settings.default_libraries),
        "per_library": settings.default_per_library,
        "seed": settings.default_seed,
        "python": settings.python,
        "builder": BUILDER_VERSION,
    }


def is_current(directory: Path, config: Config) -> bool:
    path = directory / RECIPE_FILE
    try:
        return json.loads(path.read_text()).get("recipe") == recipe(config)
    except (OSError, ValueError):
        return False


def ensure_default_tasks(
    config: Config, *, rebuild: bool = False, progress: ProgressFn | None = None
) -> Path:
    """The default task directory, built when missing or stale (or when `rebuild`).

    Safe to call from several processes at once: builders take an exclusive file lock,
    and one that waited finds the set current and returns it."""
    directory = config.tasks_dir
    if not rebuild and is_current(directory, config):
        return directory
    has_tasks = directory.is_dir() and any((d / TASK_FILE).is_file() for d in directory.iterdir())
    if has_tasks and not (directory / RECIPE_FILE).is_file():
        return directory  # the user's own task set: never overwritten
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(directory.with_name(f".{directory.name}.lock")) as waited:
        if is_current(directory, config) and (waited or not rebuild):
            return directory
        partial = directory.with_name(directory.name + ".partial")
        asyncio.run(_build(config, partial, progress))
        if directory.exists():
            shutil.rmtree(directory)
        partial.rename(directory)
    return directory


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[bool]:
    """Hold an exclusive lock on `lock_path`; yields whether another holder made us wait."""
    with open(lock_path, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            waited = False
        except BlockingIOError:
            fcntl.flock(handle, fcntl.LOCK_EX)
            waited = True
        try:
            yield waited
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def _build(config: Config, out: Path, progress: ProgressFn | None) -> list[BuildReport]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    factory = make_factory(config.sandbox)
    cache = config.state_dir / "cache"
    settings = config.tasks
    reports = []
    for spec_text in settings.default_libraries:
        request = BuildRequest(
            SdistSpec.parse(spec_text), out, settings.default_per_library, settings.default_seed
        )
        reports.append(await build_from_sdist(request, settings, factory, cache, progress))
    total = sum(len(r.task_ids) for r in reports)
    libraries = sum(1 for r in reports if r.task_ids)
    if total < MIN_TASKS or libraries < MIN_LIBRARIES:
        summary = ", ".join(f"{r.spec}: {len(r.task_ids)}" for r in reports)
        raise DefaultTasksError(
            f"default task set too small ({total} tasks from {libraries} libraries; need {MIN_TASKS} "
            f"from {MIN_LIBRARIES}): {summary}; add libraries to tasks.default_libraries"
        )
    (out / RECIPE_FILE).write_text(
        json.dumps(
            {
                "recipe": recipe(config),
                "tasks": total,
                "libraries": {r.spec: r.task_ids for r in reports},
                "build_s": round(sum(r.duration_s for r in reports), 1),
            },
            indent=1,
        )
    )
    return reports

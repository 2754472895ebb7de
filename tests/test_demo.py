"""``make demo`` end to end, on the test server: ``python -m pgstore.demo`` with
``PGSTORE_DSN`` set (so it starts no server of its own) must pass its own checks, draw a
valid PNG, and tell the freeze and the kill in its timeline."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # about 20 s: real processes, real leases of 1.5 s


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height of a well-formed PNG: signature, chunks with good CRCs, IHDR first,
    IEND last, image data that inflates to exactly the rows IHDR announces."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, idat = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append(kind)
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert chunks[0] == b"IHDR" and chunks[-1] == b"IEND"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    assert len(zlib.decompress(idat)) == height * (1 + width * channels * depth // 8)
    return width, height


def test_demo_end_to_end(pgstore_database: str, tmp_path: Path) -> None:
    env = {**os.environ, "PGSTORE_DSN": pgstore_database}
    done = subprocess.run(
        [sys.executable, "-m", "pgstore.demo", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert out.rstrip().endswith("all checks hold")
    assert "to look at the store: pgstore web --schema pgstore_demo" in out

    width, height = _png_size((tmp_path / "leases.png").read_bytes())
    assert width > 1000 and height > 500

    # The freeze: SIGSTOP mid-run, another scheduler re-claims the same occurrence with
    # a higher token and completes it, then SIGCONT and the frozen holder is refused.
    freeze = re.search(r"(scheduler-\d) +FREEZE +report +SIGSTOP while running report token "
                       r"(\d+)", out)
    assert freeze, out
    frozen, token = freeze.group(1), int(freeze.group(2))
    reclaim = re.search(rf"(scheduler-\d) +RE-CLAIM +report +token (\d+): .* token {token} of "
                        rf"{frozen} having expired", out)
    assert reclaim and reclaim.group(1) != frozen and int(reclaim.group(2)) > token, out
    assert re.search(rf"{frozen} +THAW +report", out), out
    assert re.search(rf"{frozen} +(REJECTED|LOST) +report +token {token}:", out), out
    assert not re.search(rf"{frozen} +complete +report +token {token} ", out), out

    # The kill: SIGKILL while holding a lease; another dispatcher leases it again, once.
    kill = re.search(r"(dispatcher-\d) +KILL +(meeting-\d\d) +SIGKILL", out)
    assert kill, out
    victim, meeting = kill.groups()
    releases = re.findall(rf"(dispatcher-\d) +RE-LEASE +{meeting} .*held by {victim}", out)
    assert len(releases) == 1 and releases[0] != victim, out
    assert re.search(rf"{releases[0]} +dispatch +{meeting} ", out), out

    # Cancels before a lease and while a bot is on its way, and the bots recalled.
    assert re.search(r"CANCEL +meeting-\d\d +-> cancelled \(no lease yet\)", out), out
    assert re.search(r"CANCEL +meeting-\d\d +-> cancelled \(dispatcher-\d is sending", out), out
    assert re.search(r"RECALL +meeting-\d\d +bot-", out), out

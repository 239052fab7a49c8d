"""bench/start_stages.py times the real cache path: every pod it serves must
end up held, converted from the API server's shape."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import start_stages  # noqa: E402


def test_every_served_pod_is_converted_and_held():
    nodes = [start_stages.cp.node_body(f"{start_stages.POOL}-{i:05d}", start_stages.POOL) for i in range(3)]
    pods = [start_stages.served_pod(i, f"{start_stages.POOL}-{i % 3:05d}") for i in range(2500)]
    times = start_stages.one_round(start_stages.pages_of(nodes), start_stages.pages_of(pods))
    assert times["pods held"] == 2500  # two pages, no pod lost or refused
    assert all(times[stage] > 0 for stage in ("nodes", "decode", "convert", "replace"))

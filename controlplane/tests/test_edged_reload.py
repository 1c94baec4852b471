"""edged's reload entry: what it reads, how much, and what a refusal may say.

A reload reads either the file edged was started with or config text sent over
the API, at most 1 MiB, off edged's loop; a FIFO or a device in place of the
file is refused at once, and no error quotes more of a rejected file than its
offending key. Refused configs never reach the data path, so these run the real
Daemon with no kernel underneath.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from controlplane.config import MAX_CONFIG_BYTES, parse_config
from controlplane.edged import Daemon, Events
from controlplane.errors import ConfigError

HANG_S = 20.0  # far longer than any refusal takes; only a reload that blocks reaches it

CFG = parse_config(
    {
        "version": 1,
        "services": [
            {
                "name": "chat",
                "vip": "198.18.255.1",
                "port": 8000,
                "backends": [{"name": "b0", "address": "198.18.1.2", "port": 8000}],
            }
        ],
    }
)


def refused(config_path: Path | None, text: str | None = None) -> tuple[str, int, list[dict]]:
    """Runs Daemon.reload on a loop of its own in a thread; (error, loop ticks meanwhile, events).
    If the reload hangs (the loop blocked in open() or read()), unblocks a FIFO and fails."""
    events = Events()
    daemon = Daemon(CFG, "eth-test", events, str(config_path) if config_path else None)
    out: dict = {}

    async def main():
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        try:
            await daemon.reload(text) if text is not None else await daemon.reload()
        except ConfigError as e:
            out["error"] = str(e)
        finally:
            ticker.cancel()
        out["ticks"] = ticks

    t = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    t.start()
    t.join(HANG_S)
    if t.is_alive():
        if config_path is not None and config_path.is_fifo():
            os.close(os.open(config_path, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked open() return
            t.join(HANG_S)
        pytest.fail(f"reload of {config_path} blocked for {HANG_S}s")
    assert "error" in out, "the reload was not refused"
    return out["error"], out["ticks"], list(events.recent)


def test_a_fifo_in_place_of_the_config_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "edge.yaml"
    os.mkfifo(fifo)
    error, _, events = refused(fifo)
    assert error == f"config: {fifo} is not a regular file"
    assert [e["kind"] for e in events] == ["reload-rejected"]


def test_a_device_in_place_of_the_config_is_refused(tmp_path):
    link = tmp_path / "edge.yaml"
    link.symlink_to("/dev/zero")
    assert refused(link)[0] == f"config: {link} is not a regular file"


def test_a_config_file_over_one_mib_is_refused_unread(tmp_path):
    big = tmp_path / "edge.yaml"
    with open(big, "wb") as f:
        f.truncate(64 * MAX_CONFIG_BYTES)  # sparse: reading it would take a while, checking it does not
    assert (
        refused(big)[0]
        == f"config: {big}: {64 * MAX_CONFIG_BYTES} bytes, more than the {MAX_CONFIG_BYTES} a config may have"
    )


def test_config_text_over_one_mib_is_refused():
    text = "#" * MAX_CONFIG_BYTES + "\n"
    assert refused(None, text)[0] == (
        f"config_text: {MAX_CONFIG_BYTES + 1} bytes, more than the {MAX_CONFIG_BYTES} a config may have"
    )


@pytest.mark.parametrize(
    "content",
    [
        "root:$6$s3cr3tSALT$hashhashhash:19000:0:99999:7:::\nbin:*:19000:0:99999:7:::\n",
        "- s3cr3t-one\n- s3cr3t-two\n",
        "s3cr3t",
    ],
    ids=["shadow-like lines", "a list", "a scalar"],
)
def test_a_refusal_quotes_nothing_of_a_file_that_is_no_config(tmp_path, content):
    """Whatever the file holds, the message names the file and the problem, never its text."""
    path = tmp_path / "edge.yaml"
    path.write_text(content)
    error, _, events = refused(path)
    assert "s3cr3t" not in error and "hash" not in error, error
    assert all("s3cr3t" not in str(e) for e in events)
    assert error.startswith("config: ")


def test_bad_config_text_is_refused_with_the_offending_key_and_the_loop_runs():
    error, ticks, events = refused(None, "version: 1\nservices: []\nnode: {bogus_key: 1}\n")
    assert error.startswith("node.bogus_key: unknown key")
    assert [e["kind"] for e in events] == ["reload-rejected"]


def test_a_reload_without_a_config_file_needs_text():
    assert refused(None)[0] == "reload: edged was started without a config file; send the config's text"


def test_joining_a_fleet_by_reload_is_refused_naming_node_fleet():
    text = (
        "version: 1\nnode: {fleet: {etcd: ['127.0.0.1:2379'], name: edge-1}}\nservices:\n"
        "  - {name: chat, vip: 198.18.255.1, port: 8000, backends: [{name: b0, address: 198.18.1.2, port: 8000}]}\n"
    )
    error, _, events = refused(None, text)
    assert error == "node.fleet: changed; joining, leaving or changing the fleet needs an edged restart"
    assert [e["kind"] for e in events] == ["reload-rejected"]

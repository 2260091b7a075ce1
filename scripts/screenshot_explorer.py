"""Take the explorer's partitions screenshot for the docs: docs/images/explorer-partitions.png.

Starts a broker in this process (a temporary data directory, a free port), creates a partitioned queue with an
uneven backlog, runs some traffic (sends, receives, a few dead letters) while the page auto-refreshes so the
sparklines fill in, stops one partition so it shows as down, and photographs the page with Debian's Chromium
through Playwright (no browser download). Usage: .venv/bin/python scripts/screenshot_explorer.py [--seconds 40]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from shardbus.model.message import Message
from shardbus.server import DEFAULT_KEY, DEFAULT_KEY_NAME, Broker

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OUT = Path(__file__).resolve().parent.parent / "docs" / "images" / "explorer-partitions.png"
QUEUE = "orders"


def traffic(ns, stop: threading.Event) -> None:
    """Keyed sends (some keys hotter than others), a receiver completing most and dead-lettering a few."""
    rng = random.Random(7)
    keys = [f"customer-{i}" for i in range(40)]
    weights = [1 + (i % 7 == 0) * 6 + (i % 5 == 0) * 2 for i in range(len(keys))]
    receiver = ns.receiver(QUEUE)
    n = 0
    while not stop.is_set():
        batch = [
            Message(
                body=f'{{"order": {n + i}, "amount": {rng.randint(1, 500)}}}'.encode(),
                content_type="application/json",
                partition_key=rng.choices(keys, weights)[0],
                message_id=f"order-{n + i}",
            )
            for i in range(rng.randint(5, 25))
        ]
        n += len(batch)
        for m in batch:
            try:
                ns.send(QUEUE, m)
            except Exception:
                pass  # its partition is down: the key waits, like a client would retry
        got = receiver.receive(rng.randint(3, 15), max_wait=0.2)
        for m in got:
            if rng.random() < 0.05:
                receiver.dead_letter(m, "ValidationFailed", "amount out of range")
            else:
                receiver.complete(m)
        time.sleep(rng.uniform(0.1, 0.4))
    receiver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the page watches the traffic")
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data, Broker(data_dir=data, port=0) as broker:
        ns = broker.namespace
        ns.create_queue(QUEUE, enable_partitioning=True, max_delivery_count=3)
        ns.create_topic("events", enable_partitioning=True)
        ns.create_subscription("events", "audit")
        for i in range(400):  # a backlog, uneven across partitions
            ns.send(QUEUE, Message(body=f'{{"order": "seed-{i}"}}'.encode(), partition_key=f"seed-{i % 23}"))
        stop = threading.Event()
        worker = threading.Thread(target=traffic, args=(ns, stop), daemon=True)
        worker.start()
        base = f"http://127.0.0.1:{broker.server.port}/explorer"
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
                page.goto(f"{base}/signin")
                page.fill("input[name=key_name]", DEFAULT_KEY_NAME)
                page.fill("input[name=key]", DEFAULT_KEY)
                page.click("button[type=submit]")
                page.goto(f"{base}/entity?path={QUEUE}")
                time.sleep(args.seconds * 0.6)
                ns.faults.stop_partition(QUEUE, 11)  # one partition down: the strip and its row turn red
                time.sleep(args.seconds * 0.4)
                page.reload()
                time.sleep(7)  # two refreshes: the sparklines have their history again
                args.output.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.output), full_page=False)
                browser.close()
        finally:
            stop.set()
            worker.join(5)
            ns.faults.restore_partition(QUEUE, 11)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()

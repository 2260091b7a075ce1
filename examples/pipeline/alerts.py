"""Read the alerts the job forwarded, one customer session at a time, with the official SDK.

python alerts.py --connection-string "..."
"""

from __future__ import annotations

import argparse

from azure.servicebus import NEXT_AVAILABLE_SESSION, ServiceBusClient
from azure.servicebus.exceptions import OperationTimeoutError


def drain(connection_string: str, wait: float = 2.0) -> dict[str, int]:
    """Receive and complete every alert; returns the count per session (customer)."""
    counts: dict[str, int] = {}
    with ServiceBusClient.from_connection_string(connection_string) as client:
        while True:
            try:
                receiver = client.get_queue_receiver("alerts", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=wait)
                with receiver:
                    session = receiver.session.session_id
                    for message in receiver:
                        counts[session] = counts.get(session, 0) + 1
                        receiver.complete_message(message)
            except OperationTimeoutError:
                return counts  # no session with messages is left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connection-string", required=True)
    args = parser.parse_args()
    counts = drain(args.connection_string)
    print(f"{sum(counts.values())} alerts in {len(counts)} customer sessions")


if __name__ == "__main__":
    main()

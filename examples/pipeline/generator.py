"""Feed the pipeline: orders as JSON, sent with the official azure-servicebus SDK, keyed by customer.

python generator.py --connection-string "Endpoint=sb://localhost:5673;..." --count 20000
"""

from __future__ import annotations

import argparse
import json
import random

from azure.servicebus import ServiceBusClient, ServiceBusMessage

CUSTOMERS = [f"customer-{i}" for i in range(50)]
BATCH = 200  # messages per batch: a batch goes to one partition, so one customer (partition key) per batch


def generate(connection_string: str, count: int, seed: int = 7) -> list[dict]:
    """Send ``count`` orders; returns them (what the job must account for)."""
    rng = random.Random(seed)
    orders: list[dict] = []
    with (
        ServiceBusClient.from_connection_string(connection_string) as client,
        client.get_topic_sender("orders") as sender,
    ):
        sent = 0
        while sent < count:
            customer = rng.choice(CUSTOMERS)
            messages = []
            for _ in range(min(BATCH, count - sent)):
                amount = round(rng.uniform(1, 1000), 2)
                order = {"order_id": f"o-{sent}", "customer": customer, "amount": amount}
                orders.append(order)
                messages.append(
                    ServiceBusMessage(
                        json.dumps(order),
                        message_id=order["order_id"],
                        partition_key=customer,
                        content_type="application/json",
                        subject="order",
                    )
                )
                sent += 1
            sender.send_messages(messages)
    return orders


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connection-string", required=True)
    parser.add_argument("--count", type=int, default=20_000)
    args = parser.parse_args()
    orders = generate(args.connection_string, args.count)
    print(f"sent {len(orders)} orders from {len({o['customer'] for o in orders})} customers")


if __name__ == "__main__":
    main()

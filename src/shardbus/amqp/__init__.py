"""AMQP 1.0 protocol engine (sans-IO) for shardbus."""

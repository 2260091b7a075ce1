"""Test support: what tests need that production code must not carry (fault injection, ``faults.py``)."""

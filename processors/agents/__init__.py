"""Thin faust shells: each feeds events to a decision and publishes the commands it returns."""

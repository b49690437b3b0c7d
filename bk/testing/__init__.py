"""Shipped test harness: local ZooKeeper launcher, local bookie clusters, crash helpers."""

"""Benchmarks: each module measures our code and its baseline in the same run and prints the ratio."""

"""Benchmarks (``dspark bench ...``): speed and memory reported as ratios measured in one run."""

//! Baselines and shared bodies for the criterion benchmarks.

"""Lab deployment: aggregator and edge processes, their keys and control plane."""

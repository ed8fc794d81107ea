"""Tasks of the A/B harness: long-horizon tool tasks with real external state."""

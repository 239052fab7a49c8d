"""Where pods can go: per-node predicates (fit) and the gang planner (gang)."""

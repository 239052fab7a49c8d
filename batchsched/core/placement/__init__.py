"""Where pods can go: per-node predicates (fit), the per-cycle capacity
index (capacity) and the all-or-nothing gang planner (gang)."""

"""specrace harness: runtime -> detect -> policies -> oracle -> report (no back edges)."""

"""determined_trials.launch: see DESIGN.md (filled in by later issues)."""

"""determined_trials.cli: see DESIGN.md (filled in by later issues)."""

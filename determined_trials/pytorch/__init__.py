"""determined_trials.pytorch: see DESIGN.md (filled in by later issues)."""

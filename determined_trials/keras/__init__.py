"""determined_trials.keras: see DESIGN.md (filled in by later issues)."""

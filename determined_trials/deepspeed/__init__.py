"""determined_trials.deepspeed: see DESIGN.md (filled in by later issues)."""

"""``make demo`` (not shipped in the wheel)."""

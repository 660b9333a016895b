"""State that must survive a daemon restart, written atomically."""

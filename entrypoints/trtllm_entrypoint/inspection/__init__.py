"""The commands that look without serving: probe, check, and the flag checks against the image."""

"""The outside world: filesystems, the one-writer lock, the progress line and the terminal."""

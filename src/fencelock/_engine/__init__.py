"""Per-server state shared by every lock of a process."""

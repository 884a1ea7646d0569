"""Pure functions over the event table: per-write table, metrics, comparison, generic stats."""

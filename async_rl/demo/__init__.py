"""The embedded CPU demo's task-specific pieces: supervised warm-start and greedy evaluation on arithmetic."""

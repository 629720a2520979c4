"""Tasks, tools and rewards."""

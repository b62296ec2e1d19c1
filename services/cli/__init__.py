"""The `warmplane` command: the main job on embedded defaults, and the services from settings."""

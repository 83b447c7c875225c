"""One module per CLI area; each exposes `app` (sub-app) or `command`."""

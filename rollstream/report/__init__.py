"""The run report: `index.html` and PNG figures of one run, every figure queried from the SQL store.

- `queries`: all the SQL (SQLAlchemy Core over the store's projections; SQLite and
  PostgreSQL), plus the README's ready-made statements;
- `figures`: pure functions from query rows to figure data (points per figure);
- `tables`: the headline figures and the outcomes table (verifier's and trainer's reward);
- `plots`: figure data -> PNG ("no data" panels for figures a run has no data for);
- `page`: the HTML page (per-figure `data-points`, for the browser test);
- `build`: `write_run_report(url, run_id, out)`, what `rollstream report` and the
  demo's end call;
- `events`: the older quick report drawn from a run's events (timeline, outcomes, turns);
- `settings`: `ReportSettings` (`[report]` in the config).

This module imports nothing, so the config can import `settings` without loading matplotlib.
"""

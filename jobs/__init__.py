"""The job service: what runs around the training of a job, between the Prefect integrations above and the ML below.

The checks before a job starts (`preflight`), the training children started and watched (`launch`), the job's lock
(`lock`), its report (`report`), the model registry and the promotion gate (`registry`), and publishing to the Hub
(`publish`). No Prefect here: the tasks in `grpoflow.tasks` wrap it; it imports only `grpoflow.trainers`.
"""
